#include "tests/cluster/cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvrail::testing {
namespace {

std::string Tail(const std::string& text, size_t n) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

std::string CannotRunCluster() { return CannotMakeNamespaces(); }

std::string MissingEtcd() {
  if (Sh("command -v etcd") != 0 || Sh("command -v etcdctl") != 0) {
    return "no etcd/etcdctl on PATH: install Debian's etcd-server and etcd-client (deploy/dev.sh "
           "PACKAGES)";
  }
  return "";
}

Cluster::Cluster(const ClusterOptions& options) : options_(options) {
  if (!net_.ok) {
    error_ = "could not make the hub namespace and its bridge";
    return;
  }
  if (options_.tls) {
    ca_ = std::make_unique<TestCa>("cluster");
    if (!ca_->status().ok()) {
      error_ = absl::StrCat("test CA: ", ca_->status().ToString());
      return;
    }
  }
  etcd_endpoint_ = net_.hub_ip + ":2379";
  prefix_ = absl::StrCat("/kvrail-cluster-test-", getpid(), "/");
}

Cluster::~Cluster() {
  // Daemons first (they would retry etcd), then etcd; the namespaces go with net_.
  for (ClusterNode& n : nodes_) n.daemon.reset();
  KillEtcd();
}

bool Cluster::StartEtcd() {
  if (etcd_pid_ > 0) return true;
  const std::string data = etcd_dir_.path() + "/data";
  const std::string log = etcd_dir_.path() + "/etcd.log";
  const std::string client_url = "http://" + etcd_endpoint_;
  // Peer URL on the hub's loopback: a one-member cluster.
  std::vector<std::string> args = {"ip",
                                   "netns",
                                   "exec",
                                   net_.hub_ns,
                                   "etcd",
                                   "--name",
                                   "kvr",
                                   "--data-dir",
                                   data,
                                   "--listen-client-urls",
                                   client_url,
                                   "--advertise-client-urls",
                                   client_url,
                                   "--listen-peer-urls",
                                   "http://127.0.0.1:2380",
                                   "--initial-advertise-peer-urls",
                                   "http://127.0.0.1:2380",
                                   "--initial-cluster",
                                   "kvr=http://127.0.0.1:2380"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  etcd_pid_ = fork();
  if (etcd_pid_ == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execvp(argv[0], argv.data());  // `ip netns exec` execs etcd: this pid is etcd's
    _exit(127);
  }
  const std::string health = NetnsPair::In(
      net_.hub_ns, "env ETCDCTL_API=3 etcdctl --dial-timeout=1s --command-timeout=1s --endpoints " +
                       etcd_endpoint_ + " endpoint health");
  for (int i = 0; i < 100; ++i) {
    if (Sh(health) == 0) return true;
    if (waitpid(etcd_pid_, nullptr, WNOHANG) == etcd_pid_) {
      etcd_pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  error_ = absl::StrCat("etcd did not come up:\n", Tail(ReadFile(log), 3000));
  KillEtcd();
  return false;
}

void Cluster::KillEtcd() {
  if (etcd_pid_ > 0) {
    kill(etcd_pid_, SIGKILL);
    waitpid(etcd_pid_, nullptr, 0);
    etcd_pid_ = -1;
  }
}

ClusterNode* Cluster::AddNode(const std::string& name) {
  const NetnsBridge::Node* net = net_.AddNode();
  if (net == nullptr) {
    error_ = absl::StrCat("node '", name, "': could not make its namespace");
    return nullptr;
  }
  nodes_.push_back(ClusterNode{name, net, nullptr});
  ClusterNode* node = &nodes_.back();
  return StartDaemon(node) ? node : nullptr;
}

bool Cluster::StartDaemon(ClusterNode* node) {
  NsDaemonOptions o;
  o.nics = 1;
  o.tile_bytes = options_.tile_bytes;
  o.slot_bytes = options_.slot_bytes;
  o.slots = options_.slots;
  o.log_level = options_.log_level;
  o.ca = ca_.get();
  o.extra_config = absl::StrCat("etcd {\n  endpoints: \"", etcd_endpoint_, "\"\n  prefix: \"",
                                prefix_, "\"\n  ttl_s: ", options_.etcd_ttl_s, "\n}\n");
  node->daemon = std::make_unique<NsDaemon>();
  node->started = absl::Now();
  if (!node->daemon->Start(node->net->ns, node->name, node->net->ip, "", "", o)) {
    error_ =
        absl::StrCat("node '", node->name, "' did not start:\n", Tail(node->daemon->Log(), 4000));
    return false;
  }
  return true;
}

void Cluster::Kill(ClusterNode* node) {
  if (node->daemon) node->daemon->Kill(SIGKILL);
}

bool Cluster::Restart(ClusterNode* node) {
  node->daemon.reset();
  return StartDaemon(node);
}

ClusterNode* Cluster::Find(const std::string& name) {
  for (ClusterNode& n : nodes_) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

std::vector<ClusterNode*> Cluster::Running() {
  std::vector<ClusterNode*> out;
  for (ClusterNode& n : nodes_) {
    if (n.running()) out.push_back(&n);
  }
  return out;
}

std::vector<absl::Time> Cluster::WaitAll(const std::vector<ClusterNode*>& observers,
                                         const PeersPredicate& done, absl::Duration timeout) {
  std::vector<absl::Time> when(observers.size(), absl::InfinitePast());
  const absl::Time until = absl::Now() + timeout;
  size_t left = observers.size();
  while (left > 0 && absl::Now() < until) {
    for (size_t i = 0; i < observers.size(); ++i) {
      if (when[i] != absl::InfinitePast()) continue;
      auto peers = observers[i]->daemon->client->ListPeers();
      if (peers.ok() && done(*observers[i], *peers)) {
        when[i] = absl::Now();
        --left;
      }
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return when;
}

v1::PeerState Cluster::StateOf(const v1::ListPeersResponse& peers, const std::string& node) {
  for (const v1::PeerInfo& p : peers.peers()) {
    if (p.node_id() == node) return p.state();
  }
  return v1::PEER_STATE_UNSPECIFIED;
}

absl::Time Cluster::RegisteredAt(const v1::ListPeersResponse& peers, const std::string& node) {
  for (const v1::PeerInfo& p : peers.peers()) {
    if (p.node_id() == node && p.has_record() && p.record().registered_unix_us() > 0) {
      return absl::FromUnixMicros(p.record().registered_unix_us());
    }
  }
  return absl::InfinitePast();
}

std::string Cluster::Logs() const {
  std::string out;
  for (const ClusterNode& n : nodes_) {
    if (n.daemon) absl::StrAppend(&out, "---- ", n.name, " ----\n", Tail(n.daemon->Log(), 3000));
  }
  absl::StrAppend(&out, "---- etcd ----\n", Tail(ReadFile(etcd_dir_.path() + "/etcd.log"), 1500));
  return out;
}

}  // namespace kvrail::testing
