// The etcd directory against a real etcd (Debian's etcd-server) started here on loopback: two
// directories see each other; one's lease ends and the other marks it down within TTL + 1 s;
// etcd killed: peers stay, state degraded; etcd restarted: ok again, registered again. Fails
// (does not skip) when the etcd binary is missing: CI installs etcd-server.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/directory/etcd_directory.h"
#include "daemon/directory/node_record.h"

namespace kvrail::directory {
namespace {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string EtcdBinary() {
  const char* env = std::getenv("KVRAIL_ETCD_BIN");
  return env != nullptr ? env : "/usr/bin/etcd";
}

// One etcd member on loopback; killed (by pid) when destroyed.
class EtcdProcess {
 public:
  EtcdProcess() {
    char tmpl[] = "/tmp/kvrail-etcd-XXXXXX";
    const char* dir = ::mkdtemp(tmpl);
    REQUIRE(dir != nullptr);
    dir_ = dir;
    client_port_ = FreePort();
    peer_port_ = FreePort();
  }
  ~EtcdProcess() {
    Kill();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }

  void Start() {
    const std::string client = absl::StrCat("http://127.0.0.1:", client_port_);
    const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
    std::vector<std::string> args = {
        EtcdBinary(), "--name", "kvrail-test", "--data-dir", dir_ + "/data",
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", absl::StrCat("kvrail-test=", peer),
        "--log-outputs", "stderr"};
    const std::string log = dir_ + "/etcd.log";
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    // Ready when a Range answers.
    auto client_or = CreateGrpcEtcdClient({{endpoint()}, "", "", "", absl::Seconds(1)});
    REQUIRE(client_or.ok());
    const absl::Time until = absl::Now() + absl::Seconds(20);
    absl::Status last;
    while (absl::Now() < until) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("etcd exited at start; its log:\n" << ReadLog());
      }
      auto range = (*client_or)->RangePrefix("/");
      if (range.ok()) return;
      last = range.status();
      absl::SleepFor(absl::Milliseconds(100));
    }
    FAIL("etcd did not answer within 20 s: " << last.ToString() << "\n" << ReadLog());
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string ReadLog() const {
    std::ifstream in(dir_ + "/etcd.log");
    std::stringstream s;
    s << in.rdbuf();
    std::string text = s.str();
    return text.size() > 4000 ? text.substr(text.size() - 4000) : text;
  }

 private:
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

constexpr char kPrefix[] = "/kvrail/live-test/nodes/";
constexpr int kTtl = 2;

std::unique_ptr<Directory> Open(const std::string& endpoint, const std::string& self,
                                bool revoke_on_close = true) {
  EtcdClientOptions client;
  client.endpoints = {endpoint};
  client.call_timeout = absl::Seconds(1);
  auto c = CreateGrpcEtcdClient(client);
  REQUIRE(c.ok());
  NodeRecordInputs in;
  in.node_id = self;
  in.address = absl::StrCat("127.0.0.1:", 7000 + self[0]);
  in.instance_id = self == "a" ? "aaaaaaaaaaaaaaaa" : "bbbbbbbbbbbbbbbb";
  in.topology.add_gpus()->set_uuid("GPU-" + self);
  in.now = absl::Now();
  EtcdDirectoryOptions o;
  o.self = self;
  o.prefix = kPrefix;
  o.ttl_s = kTtl;
  o.record = BuildNodeRecord(in);
  o.endpoints = {endpoint};
  o.backoff_initial = absl::Milliseconds(100);
  o.backoff_max = absl::Milliseconds(500);
  o.revoke_on_close = revoke_on_close;
  auto d = CreateEtcdDirectory(o, *std::move(c));
  REQUIRE(d.ok());
  return *std::move(d);
}

template <typename Pred>
bool Eventually(Pred pred, absl::Duration limit) {
  const absl::Time until = absl::Now() + limit;
  while (absl::Now() < until) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return pred();
}

TEST_CASE("etcd directory against a real etcd: membership, lease end, outage, restart") {
  if (::access(EtcdBinary().c_str(), X_OK) != 0) {
    FAIL("no etcd binary at " << EtcdBinary()
                              << " (install Debian's etcd-server; deploy/dev.sh setup does)");
  }
  EtcdProcess etcd;
  etcd.Start();

  std::unique_ptr<Directory> a = Open(etcd.endpoint(), "a");
  std::unique_ptr<Directory> b = Open(etcd.endpoint(), "b", /*revoke_on_close=*/false);
  REQUIRE(a->Status().state() == "ok");
  REQUIRE(b->Status().state() == "ok");
  auto sees = [](Directory& d, const std::string& node) {
    auto p = d.Lookup(node);
    return p.ok() && p->registered;
  };
  REQUIRE(Eventually([&] { return sees(*a, "b") && sees(*b, "a"); }, absl::Seconds(2)));
  CHECK(a->Lookup("b")->record.gpus(0).uuid() == "GPU-b");
  CHECK(a->Lookup("b")->address == absl::StrCat("127.0.0.1:", 7000 + 'b'));
  a->MarkUp("b", absl::Now(), 1);
  CHECK(a->Lookup("b")->state == PeerState::kUp);

  SECTION("a lease that ends marks the peer down for the other within TTL + 1 s") {
    b.reset();  // its keep-alives stop; the lease is left to expire
    const absl::Time stopped = absl::Now();
    REQUIRE(Eventually([&] { return a->Lookup("b")->state == PeerState::kDown; },
                       absl::Seconds(kTtl + 1)));
    const absl::Duration took = absl::Now() - stopped;
    INFO("marked down after " << absl::FormatDuration(took));
    CHECK(took <= absl::Seconds(kTtl + 1));
    CHECK(a->Peers().size() == 1);  // still listed
    CHECK(!a->Lookup("b")->registered);
    // It comes back (a new daemon run): up-able again.
    b = Open(etcd.endpoint(), "b");
    REQUIRE(Eventually([&] { return sees(*a, "b"); }, absl::Seconds(2)));
    CHECK(a->Lookup("b")->state == PeerState::kUnknown);
  }

  SECTION("etcd killed: peers stay, degraded; restarted: ok and registered again") {
    etcd.Kill();
    REQUIRE(Eventually([&] { return a->Status().state() == "degraded"; }, absl::Seconds(5)));
    REQUIRE(Eventually([&] { return b->Status().state() == "degraded"; }, absl::Seconds(5)));
    CHECK(!a->Status().last_error().empty());
    CHECK(a->Status().reason().find("etcd unreachable") != std::string::npos);
    REQUIRE(a->Peers().size() == 1);
    CHECK(a->Lookup("b")->state == PeerState::kUp);  // nothing dropped because etcd is gone
    // Longer than the TTL: the leases may expire meanwhile; the peers still stay.
    absl::SleepFor(absl::Seconds(kTtl + 1));
    CHECK(a->Lookup("b")->state == PeerState::kUp);

    etcd.Start();
    REQUIRE(Eventually([&] { return a->Status().state() == "ok" && b->Status().state() == "ok"; },
                       absl::Seconds(10)));
    CHECK(a->Status().registrations() >= 2);
    CHECK(b->Status().registrations() >= 2);
    REQUIRE(Eventually([&] { return sees(*a, "b") && sees(*b, "a"); }, absl::Seconds(3)));
  }
  a.reset();
  b.reset();
}

}  // namespace
}  // namespace kvrail::directory
