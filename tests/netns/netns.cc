#include "tests/netns/netns.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"

namespace kvrail::testing {

int Sh(const std::string& cmd) {
  const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string CannotMakeNamespaces() {
  if (geteuid() != 0) return "not root: network namespaces need CAP_SYS_ADMIN";
  const std::string probe = "kvrprobe" + std::to_string(getpid());
  if (Sh("ip netns add " + probe) != 0) return "`ip netns add` failed (no rights or no iproute2)";
  Sh("ip netns del " + probe);
  return "";
}

NetnsPair::NetnsPair() {
  static int counter = 0;
  const std::string tag = std::to_string(getpid() % 100000) + "x" + std::to_string(counter++);
  ns_a = "kvrA" + tag;
  ns_b = "kvrB" + tag;
  veth_a = "kva" + tag;
  veth_b = "kvb" + tag;
  const int subnet = 20 + (getpid() + counter * 7) % 200;
  ip_a = "10." + std::to_string(subnet) + ".0.1";
  ip_b = "10." + std::to_string(subnet) + ".0.2";
  ok = Sh("ip netns add " + ns_a) == 0 && Sh("ip netns add " + ns_b) == 0 &&
       Sh("ip link add " + veth_a + " type veth peer name " + veth_b) == 0 &&
       Sh("ip link set " + veth_a + " netns " + ns_a) == 0 &&
       Sh("ip link set " + veth_b + " netns " + ns_b) == 0 &&
       Sh(In(ns_a, "ip addr add " + ip_a + "/24 dev " + veth_a)) == 0 &&
       Sh(In(ns_b, "ip addr add " + ip_b + "/24 dev " + veth_b)) == 0 &&
       Sh(In(ns_a, "ip link set " + veth_a + " up")) == 0 &&
       Sh(In(ns_b, "ip link set " + veth_b + " up")) == 0 &&
       Sh(In(ns_a, "ip link set lo up")) == 0 && Sh(In(ns_b, "ip link set lo up")) == 0;
}

NetnsPair::~NetnsPair() {
  Sh("ip netns del " + ns_a);
  Sh("ip netns del " + ns_b);
  // Deleting the namespaces removes the veth pair; this only matters if a move above failed.
  Sh("ip link del " + veth_a);
}

NetnsBridge::NetnsBridge() {
  static int counter = 0;
  tag_ = std::to_string(getpid() % 100000) + "x" + std::to_string(counter++);
  subnet_ = "10." + std::to_string(20 + (getpid() + counter * 7) % 200) + ".0.";
  hub_ns = "kvrH" + tag_;
  bridge = "kbr" + tag_;
  hub_ip = subnet_ + "254";
  const auto in_hub = [&](const std::string& cmd) { return Sh(NetnsPair::In(hub_ns, cmd)) == 0; };
  ok = Sh("ip netns add " + hub_ns) == 0 && in_hub("ip link set lo up") &&
       in_hub("ip link add " + bridge + " type bridge") &&
       in_hub("ip addr add " + hub_ip + "/24 dev " + bridge) &&
       in_hub("ip link set " + bridge + " up");
}

NetnsBridge::~NetnsBridge() {
  for (const Node& n : nodes) Sh("ip netns del " + n.ns);
  Sh("ip netns del " + hub_ns);
}

const NetnsBridge::Node* NetnsBridge::AddNode() {
  if (!ok || nodes.size() >= 250) return nullptr;
  const std::string n = std::to_string(nodes.size() + 1);
  Node node{"kvrN" + tag_ + "n" + n, "kn" + tag_ + "n" + n, subnet_ + n};
  const std::string hub_end = "kh" + tag_ + "n" + n;
  if (Sh("ip netns add " + node.ns) != 0) return nullptr;
  nodes.push_back(node);  // deleted on destruction from here on
  const bool made =
      Sh("ip link add " + node.veth + " type veth peer name " + hub_end) == 0 &&
      Sh("ip link set " + node.veth + " netns " + node.ns) == 0 &&
      Sh("ip link set " + hub_end + " netns " + hub_ns) == 0 &&
      Sh(NetnsPair::In(hub_ns, "ip link set " + hub_end + " master " + bridge)) == 0 &&
      Sh(NetnsPair::In(hub_ns, "ip link set " + hub_end + " up")) == 0 &&
      Sh(NetnsPair::In(node.ns, "ip addr add " + node.ip + "/24 dev " + node.veth)) == 0 &&
      Sh(NetnsPair::In(node.ns, "ip link set " + node.veth + " up")) == 0 &&
      Sh(NetnsPair::In(node.ns, "ip link set lo up")) == 0;
  if (!made) {
    Sh("ip link del " + node.veth);  // only matters if a move above failed
    return nullptr;
  }
  return &nodes.back();
}

std::string NetnsPair::In(const std::string& ns, const std::string& cmd) {
  return "ip netns exec " + ns + " " + cmd;
}

bool NsDaemon::Start(const std::string& ns, const std::string& node, const std::string& ip,
                     const std::string& peer, const std::string& peer_ip,
                     const NsDaemonOptions& options) {
  socket = dir.path() + "/kvrail.sock";
  log = dir.path() + "/kvraild.log";
  const std::string config = dir.path() + "/kvraild.textproto";
  {
    std::ofstream f(config);
    f << "node_id: \"" << node << "\"\n";
    if (options.ca != nullptr) {
      absl::StatusOr<std::string> tls = options.ca->ConfigFor(node);
      if (!tls.ok()) {
        std::ofstream(log) << "test CA: " << tls.status() << "\n";
        return false;
      }
      f << *tls;
    } else {
      f << "insecure_peers: true\n";
    }
    if (!peer.empty()) {
      f << "peers { key: \"" << peer << "\" value: \"" << peer_ip << ":" << options.peer_port
        << "\" }\n";
    }
    f << "fabric {\n";
    if (options.nic_ips.empty()) {
      for (int i = 0; i < options.nics; ++i) f << "  nics: \"" << ip << "\"\n";
    }
    for (const std::string& nic : options.nic_ips) f << "  nics: \"" << nic << "\"\n";
    if (!options.fabric_extra.empty()) f << "  " << options.fabric_extra << "\n";
    f << "  slots: " << options.slots << "\n  slot_bytes: " << options.slot_bytes
      << "\n  liveness_timeout_ms: 2000\n  heartbeat_interval_ms: 200\n}\n";
    f << options.extra_config;
  }
  const std::string bin = RunfilePath("daemon/kvraild");
  const std::string listen = ip + ":" + std::to_string(options.port);
  tcp_port = options.port;
  const std::string tile = std::to_string(options.tile_bytes);
  // kvraild's command line, behind `ip netns exec NS` unless NS is this namespace (loopback
  // "nodes" on one machine). Built before the fork: the child only execs.
  std::vector<std::string> args;
  if (!ns.empty()) args = {"ip", "netns", "exec", ns};
  for (const std::string& a :
       {bin, std::string("--socket"), socket, std::string("--tcp-listen"), listen,
        std::string("--node-id"), node, std::string("--config"), config,
        std::string("--tile-bytes"), tile, std::string("--log-level"), options.log_level,
        std::string("--drain-timeout-ms"), std::string("1000")}) {
    args.push_back(a);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid = fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto c = client::Client::Connect(socket);
    if (c.ok() && (*c)->GetStats().ok()) {
      client = *std::move(c);
      return true;
    }
  }
  return false;
}

void NsDaemon::Kill(int sig) {
  if (pid > 0) {
    kill(pid, sig);
    // Bounded: a daemon that does not exit within 15 s of the signal is killed (and said so), so
    // a stuck shutdown fails its test instead of hanging it until Bazel's timeout.
    for (int i = 0; i < 1500 && waitpid(pid, nullptr, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (waitpid(pid, nullptr, WNOHANG) == 0) {
      std::fprintf(stderr, "kvraild (pid %d, %s) did not exit within 15 s of signal %d: SIGKILL\n",
                   static_cast<int>(pid), socket.c_str(), sig);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    pid = -1;
  }
}

std::string NsDaemon::Log() const {
  std::ifstream f(log);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

NsDaemon::~NsDaemon() {
  client.reset();
  Kill(SIGTERM);
}

absl::Status NsDaemon::Export(uint64_t region, const std::string& to) {
  // Through the region owner's client: only the owner may export a region.
  return client->ExportRegion(region, to).status();
}

std::string NsDaemon::WriteGrant(uint64_t region) {
  absl::StatusOr<v1::Grant> grant = client->CreateGrant(region, v1::GRANT_ACCESS_WRITE);
  if (!grant.ok()) {
    std::fprintf(stderr, "write grant of region %llu: %s\n",
                 static_cast<unsigned long long>(region), grant.status().ToString().c_str());
    return "";
  }
  return grant->token();
}

std::string LoopbackIp() {
  static std::mt19937 rng{std::random_device{}()};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string ip =
        absl::StrCat("127.", 1 + rng() % 250, ".", rng() % 256, ".", 1 + rng() % 254);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(7070);
    if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) continue;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const bool free = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (free) return ip;
  }
  return "127.0.0.1";
}

double FabricGauge(NsDaemon& node, const std::string& name) {
  auto stats = node.client->GetStats();
  if (!stats.ok()) return -1;
  for (const auto& e : stats->engine_states()) {
    if (e.name() != "fabric") continue;
    auto it = e.gauges().find(name);
    if (it != e.gauges().end()) return it->second;
  }
  return -1;
}

}  // namespace kvrail::testing
