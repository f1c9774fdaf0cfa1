// kvraild with `etcd { ... }` against a real etcd on loopback: two daemons find each other
// through etcd (no `peers`), `kvrail status` / health / metrics say ok; etcd killed: the peers stay
// and everything says degraded while liveness stays SERVING; etcd restarted: ok again; a daemon
// killed: the other marks it down.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/directory/etcd_test_server.h"
#include "tests/harness/daemon_process.h"

namespace kvrail {
namespace {

using ::kvrail::testing::DaemonProcess;
using ::kvrail::testing::RunCommand;
using ::kvrail::testing::RunfilePath;
using ::kvrail::testing::TempDir;

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

testing::CommandResult Cli(const DaemonProcess& d, std::vector<std::string> args) {
  args.insert(args.begin(), {RunfilePath("tools/kvrail/kvrail"), "--socket", d.socket()});
  return RunCommand(args);
}

template <typename Pred>
bool Eventually(Pred pred, absl::Duration limit) {
  const absl::Time until = absl::Now() + limit;
  while (absl::Now() < until) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return pred();
}

TEST_CASE("kvraild daemons find each other through etcd; an outage is degraded, not fatal") {
  directory::testing::EtcdTestServer etcd;
  const absl::Status started = etcd.Start();  // fails (not skips) without the etcd binary
  INFO(started.ToString());
  REQUIRE(started.ok());

  TempDir dir_a, dir_b;
  DaemonProcess a, b;
  int metrics_port = 0;
  auto start = [&](DaemonProcess& d, const TempDir& dir, const std::string& node) {
    const int port = FreePort();
    if (node == "a") metrics_port = FreePort();
    const std::string config = dir.path() + "/kvraild.textproto";
    std::ofstream(config)
        << "node_id: \"" << node << "\"\n"
        << "tcp_listen: \"127.0.0.1:" << port << "\"\n"
        << "insecure_peers: true\n"
        << "cuda_engine: \"off\"\n"
        << (node == "a" ? absl::StrCat("metrics_listen: \"127.0.0.1:", metrics_port, "\"\n") : "")
        << "etcd { endpoints: \"" << etcd.endpoint() << "\" ttl_s: 2 }\n";
    REQUIRE(d.Start(dir.path(), {"--config", config}));
  };
  start(a, dir_a, "a");
  start(b, dir_b, "b");

  // Found through etcd alone, and up through the fabric's hello.
  auto peer_state = [&](const DaemonProcess& d, const std::string& node) {
    const auto out = Cli(d, {"peers", "--json"});
    const size_t at = out.out.find("\"node_id\": \"" + node + "\"");
    if (at == std::string::npos) return std::string("absent");
    const size_t state = out.out.find("\"state\": \"", at);
    return out.out.substr(state + 10, out.out.find('"', state + 10) - state - 10);
  };
  REQUIRE(Eventually(
      [&] {
        return peer_state(a, "b") == "PEER_STATE_UP" && peer_state(b, "a") == "PEER_STATE_UP";
      },
      absl::Seconds(10)));
  CHECK(Cli(a, {"peers", "--json"}).out.find("\"source\": \"PEER_SOURCE_ETCD\"") !=
        std::string::npos);
  auto status_line = [&](const DaemonProcess& d) {
    const std::string out = Cli(d, {"status"}).out;
    const size_t at = out.find("directory:");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  CHECK(status_line(a).find("etcd ok (1 peers, 1 registered") != std::string::npos);
  CHECK(Cli(a, {"health", "--service", "kvrail.v1.Directory"}).exit_code == 0);
  CHECK(testing::HttpGet(metrics_port, "/metrics").find(R"(kvrail_directory_up{kind="etcd"} 1)") !=
        std::string::npos);

  // etcd gone: degraded everywhere it shows, liveness still SERVING, the peer kept and up.
  etcd.Kill();
  REQUIRE(Eventually([&] { return status_line(a).find("etcd DEGRADED") != std::string::npos; },
                     absl::Seconds(5)));
  CHECK(Cli(a, {"health"}).exit_code == 0);
  CHECK(Cli(a, {"health", "--service", "kvrail.v1.Transfer"}).exit_code == 0);
  CHECK(Cli(a, {"health", "--service", "kvrail.v1.Directory"}).exit_code == 1);
  CHECK(testing::HttpGet(metrics_port, "/metrics").find(R"(kvrail_directory_up{kind="etcd"} 0)") !=
        std::string::npos);
  absl::SleepFor(absl::Seconds(3));  // past the TTL
  CHECK(peer_state(a, "b") == "PEER_STATE_UP");

  // etcd back: ok again.
  REQUIRE(etcd.Start().ok());
  REQUIRE(Eventually([&] { return status_line(a).find("etcd ok") != std::string::npos; },
                     absl::Seconds(10)));
  CHECK(status_line(a).find("2 registrations") != std::string::npos);
  CHECK(Cli(a, {"health", "--service", "kvrail.v1.Directory"}).exit_code == 0);

  // b killed (no goodbye): its lease ends and a marks it down (still listed).
  ::kill(b.pid(), SIGKILL);
  const absl::Time killed = absl::Now();
  // Its lease (ttl_s 2) or the fabric's liveness timeout (3 s) ends it: 2.0-2.1 s measured with
  // the 2 cores loaded 3.5x over, each poll running the CLI. The bound is liveness (20 s), not
  // that time (4 s left less than 2x): it still fails when nothing marks b down. Printed.
  REQUIRE(Eventually([&] { return peer_state(a, "b") == "PEER_STATE_DOWN"; }, absl::Seconds(20)));
  WARN("etcd_daemon_test: b marked down " << absl::FormatDuration(absl::Now() - killed)
                                          << " after its SIGKILL");
  CHECK(a.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail
