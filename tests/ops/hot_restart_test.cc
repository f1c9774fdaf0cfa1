// Hot restart (daemon/handover): a new kvraild takes over from the running one on the same
// socket while client processes keep transfers in flight. Nothing fails, every byte is checked,
// sessions and regions stay usable, Stats shows the new instance under the same lineage. A
// successor that cannot start leaves the old daemon serving; a handover socket of another uid is
// refused. Real processes, host engine, a temporary folder.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/integration/kv_fixture.h"
#include "tests/ops/child_process.h"

namespace kvrail::testing {
namespace {

v1::Stats StatsOf(const std::string& socket) {
  auto c = client::Client::Connect(socket);
  REQUIRE(c.ok());
  auto stats = (*c)->GetStats();
  REQUIRE(stats.ok());
  return *stats;
}

// One transfer on regions registered before, checked byte for byte; REQUIREs success.
struct Pair {
  std::unique_ptr<client::HostBuffer> src, dst;
  uint64_t src_id = 0, dst_id = 0;
};

Pair MakePair(client::Client& c) {
  const auto layout =
      MakeLayout(1, 1, 8, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(c, layout, false, "src");
  Pool dst = MakePool(c, layout, true, "dst");
  for (size_t i = 0; i < src.buffer->size(); ++i)
    src.buffer->data()[i] = static_cast<uint8_t>(i * 7);
  Pair pair;
  pair.src_id = src.id();
  pair.dst_id = dst.id();
  pair.src = std::move(src.buffer);
  pair.dst = std::move(dst.buffer);
  return pair;
}

void MoveAndCheck(client::Client& c, Pair& pair) {
  std::memset(pair.dst->data(), kPoison, pair.dst->size());
  const std::vector<uint32_t> blocks = {0, 1, 2, 3, 4, 5, 6, 7};
  const v1::TransferStatus s =
      RunToEnd(c, client::MakeBlockTransfer(pair.src_id, blocks, pair.dst_id, blocks));
  REQUIRE(s.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(std::memcmp(pair.src->data(), pair.dst->data(), pair.src->size()) == 0);
}

TEST_CASE("a successor takes over while 150 transfers from 3 processes are in flight") {
  TempDir dir;
  DaemonProcess old_daemon;
  REQUIRE(old_daemon.Start(dir.path(), {"--host-threads", "1", "--tile-bytes", "65536"}));
  const v1::Stats before = StatsOf(old_daemon.socket());
  REQUIRE_FALSE(before.lineage_id().empty());

  constexpr int kClients = 3;
  constexpr int kBatch = 50;  // in flight per client: 150 in all
  std::vector<std::unique_ptr<ChildProcess>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{RunfilePath("tests/ops/hot_restart_client"), old_daemon.socket(),
                                 std::to_string(kBatch), std::to_string(i + 1)}));
  }
  for (auto& c : clients) REQUIRE(c->ReadLine() == "READY");  // each has its first 50 submitted

  const absl::Time started = absl::Now();
  DaemonProcess successor;
  REQUIRE(successor.Start(dir.path(),
                          {"--host-threads", "1", "--tile-bytes", "65536", "--take-over", "auto"},
                          true, "successor.log", 30000));
  INFO(successor.ReadLog());
  INFO(old_daemon.ReadLog());
  // The predecessor handed over and exited 0 by itself.
  CHECK(old_daemon.Stop(0, 20000) == 0);
  const absl::Duration took = absl::Now() - started;
  CHECK(old_daemon.ReadLog().find("handed over to the successor") != std::string::npos);
  CHECK(successor.ReadLog().find("take_over: committed") != std::string::npos);

  // Clients keep going a moment on the successor, then stop and report.
  absl::SleepFor(absl::Milliseconds(200));
  uint64_t transfers = 0;
  for (auto& c : clients) c->CloseStdin();
  for (auto& c : clients) {
    const std::string done = c->ReadLine();
    INFO(done);
    CHECK(done.find("failed=0 corrupt=0 lost=0 lineage_kept=1 instance_changed=1") !=
          std::string::npos);
    CHECK(c->Wait() == 0);
    const size_t at = done.find("transfers=");
    REQUIRE(at != std::string::npos);
    transfers += std::stoull(done.substr(at + 10));
  }
  CHECK(transfers >= 3 * (kBatch + 1));
  const v1::Stats after = StatsOf(successor.socket());
  CHECK(after.instance_id() != before.instance_id());
  CHECK(after.lineage_id() == before.lineage_id());
  CHECK(after.transfers_failed() == 0);
  // The clients' pause: from the predecessor pausing to the successor serving (log times).
  const std::string old_log = old_daemon.ReadLog();
  auto time_of = [&old_log](const std::string& what) {
    const size_t at = old_log.find(what);
    const size_t line = old_log.rfind('\n', at) + 1;
    absl::Time t;
    std::string error;
    return at != std::string::npos &&
                   absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", old_log.substr(line, 27), &t, &error)
               ? t
               : absl::InfinitePast();
  };
  const absl::Duration pause = time_of("the successor serves now") - time_of("a successor asks");
  std::printf(
      "hot restart: pause %s (predecessor paused to successor serving); successor start "
      "to predecessor exit %s; %llu transfers, 0 failed\n",
      absl::FormatDuration(pause).c_str(), absl::FormatDuration(took).c_str(),
      static_cast<unsigned long long>(transfers));
  CHECK(successor.Stop(SIGTERM) == 0);
}

TEST_CASE(
    "a successor that fails to start leaves the old daemon serving; the next one takes over") {
  TempDir dir;
  DaemonProcess old_daemon;
  REQUIRE(old_daemon.Start(dir.path()));
  auto c = client::Client::Connect(old_daemon.socket());
  REQUIRE(c.ok());
  Pair pair = MakePair(**c);
  MoveAndCheck(**c, pair);
  const v1::Stats before = StatsOf(old_daemon.socket());

  // A TCP port held without SO_REUSEPORT: the successor's gRPC server cannot bind it, after it
  // has received the predecessor's state and before it commits.
  const int held = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(held >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(held, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(held, 1) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(held, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  {
    DaemonProcess failing;
    CHECK_FALSE(failing.Start(
        dir.path(),
        {"--take-over", "auto", "--tcp-listen", "127.0.0.1:" + port, "--insecure-peers"}, true,
        "failing.log", 30000));
    INFO(failing.ReadLog());
    CHECK(failing.ReadLog().find("could not bind") != std::string::npos);
    CHECK(failing.ReadLog().find("take_over: committed") == std::string::npos);
  }
  ::close(held);
  // The old daemon resumed: same instance, the session and its regions work.
  for (int i = 0; i < 200 && old_daemon.ReadLog().find("serving on") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  INFO(old_daemon.ReadLog());
  CHECK(old_daemon.ReadLog().find("no handover") != std::string::npos);
  CHECK(StatsOf(old_daemon.socket()).instance_id() == before.instance_id());
  CHECK_FALSE((*c)->session_lost());
  MoveAndCheck(**c, pair);

  // A successor that can start takes over; the session and regions go on under it.
  DaemonProcess successor;
  REQUIRE(successor.Start(dir.path(), {"--take-over", "auto"}, true, "successor.log", 30000));
  CHECK(old_daemon.Stop(0, 20000) == 0);
  MoveAndCheck(**c, pair);
  CHECK_FALSE((*c)->session_lost());
  const v1::Stats after = StatsOf(successor.socket());
  CHECK(after.instance_id() != before.instance_id());
  CHECK(after.lineage_id() == before.lineage_id());
  c->reset();
  CHECK(successor.Stop(SIGTERM) == 0);
}

TEST_CASE("a handover socket of another uid is refused") {
  // Making a socket of another uid takes root (CI runs as root).
  REQUIRE(::geteuid() == 0);
  TempDir dir;
  // Under /tmp: the test's own temporary folder may sit below folders only root may enter.
  char foreign[] = "/tmp/kvrail-foreign-XXXXXX";
  REQUIRE(::mkdtemp(foreign) != nullptr);
  const std::string foreign_dir = foreign;
  REQUIRE(::chmod(foreign_dir.c_str(), 0777) == 0);
  const std::string path = foreign_dir + "/kvrail.sock.handover";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t impostor = ::fork();
  REQUIRE(impostor >= 0);
  if (impostor == 0) {
    // uid 65534 (nobody) listens where a predecessor would.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const int s = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(s, 1) != 0) {
      ::_exit(3);
    }
    (void)!::write(ready[1], "x", 1);
    const int conn = ::accept(s, nullptr, nullptr);
    char buffer[64];
    // Exit 10 when the successor said anything (it must not even say HELLO).
    const ssize_t n = conn >= 0 ? ::read(conn, buffer, sizeof(buffer)) : -1;
    ::_exit(n > 0 ? 10 : 0);
  }
  ::close(ready[1]);
  char byte;
  if (::read(ready[0], &byte, 1) != 1) {
    int status = 0;
    ::waitpid(impostor, &status, 0);
    FAIL("the uid 65534 listener did not start (exit " << WEXITSTATUS(status)
                                                       << "; 2: setuid refused)");
  }
  DaemonProcess successor;
  CHECK_FALSE(successor.Start(dir.path(), {"--take-over", path}, true, "successor.log", 10000));
  INFO(successor.ReadLog());
  CHECK(successor.ReadLog().find("uid 65534") != std::string::npos);
  int status = 0;
  REQUIRE(::waitpid(impostor, &status, 0) == impostor);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  ::unlink(path.c_str());
  ::rmdir(foreign_dir.c_str());
}

}  // namespace
}  // namespace kvrail::testing
