// Faults against a real kvraild: a client process killed
// (SIGKILL) while its transfers run, and a layer-wise producer killed before it marked its
// layers ready. The daemon must survive each (it still answers, and stops cleanly), the killed
// party's transfers must end (a failure with a message, not a transfer left running), and no
// byte outside a destination changes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvrail_client.h"
#include "tests/fault/fault_layout.h"
#include "tests/harness/daemon_process.h"

extern char** environ;

namespace kvrail::testing {
namespace {

constexpr uint8_t kPoison = 0xAB;

// A fault_client child: its stdout's first line, then SIGKILL by pid.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    args.insert(args.begin(), RunfilePath("tests/fault/fault_client"));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    REQUIRE(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~Child() {
    Kill();
    ::close(out_);
  }
  // The first line the child printed ("" when none came within `timeout_ms`).
  std::string Line(int timeout_ms = 30000) {
    std::string line;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < end) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out_, buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, n);
    }
    return line.substr(0, line.find('\n'));
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
};

std::vector<uint64_t> Ids(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  in >> word;
  std::vector<uint64_t> ids;
  uint64_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

// Waits until transfer `id` has ended; its final status (state UNSPECIFIED when it did not end
// within `seconds`).
v1::TransferStatus AwaitEnd(client::Client& c, uint64_t id, int seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  v1::TransferStatus last;
  while (std::chrono::steady_clock::now() < end) {
    auto s = c.Get(id);
    if (s.ok()) {
      last = *s;
      if (client::IsFinal(s->state())) return last;
    } else if (s.status().code() == absl::StatusCode::kNotFound) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  last.set_state(v1::TRANSFER_STATE_UNSPECIFIED);
  return last;
}

TEST_CASE("a client killed while its transfers run: the daemon survives and they end") {
  TempDir dir;
  DaemonProcess daemon;
  // One engine thread and 4 KiB tiles: 8 x 128 MiB take seconds, so they are running at the kill.
  REQUIRE(daemon.Start(dir.path(), {"--tile-bytes", "4096", "--host-threads", "1"}));
  auto observer = client::Client::Connect(daemon.socket());
  REQUIRE(observer.ok());
  Child child({daemon.socket(), "busy"});
  const std::vector<uint64_t> ids = Ids(child.Line());
  REQUIRE(ids.size() == 8);
  auto before = (*observer)->Get(ids.back());
  INFO(before.status().ToString());
  REQUIRE(before.ok());  // the operator (CI runs as root) sees every transfer
  CHECK_FALSE(client::IsFinal(before->state()));
  child.Kill();
  for (uint64_t id : ids) {
    const v1::TransferStatus end = AwaitEnd(**observer, id, 60);
    INFO("transfer " << id << ": " << v1::TransferState_Name(end.state()) << " "
                     << end.error_message());
    CHECK(end.state() != v1::TRANSFER_STATE_UNSPECIFIED);  // ended
    if (end.state() == v1::TRANSFER_STATE_FAILED || end.state() == v1::TRANSFER_STATE_CANCELLED) {
      CHECK_FALSE(end.error_message().empty());
    }
  }
  // Its regions went with its session; the daemon still serves.
  auto regions = (*observer)->ListRegions();
  REQUIRE(regions.ok());
  CHECK(regions->regions_size() == 0);
  CHECK((*observer)->GetStats().ok());
  observer->reset();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

TEST_CASE(
    "a layer-wise producer killed before marking its layers ready: its transfer fails at "
    "once, only the ready layer landed, nothing outside the destination changed") {
  constexpr uint32_t kLayers = 4;
  TempDir dir;
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path(), {"--tile-bytes", "16384"}));
  auto connected = client::Client::Connect(daemon.socket());
  REQUIRE(connected.ok());
  client::Client& c = **connected;
  const v1::PagedKvLayout layout = FaultLayout(kLayers);
  const uint64_t bytes = LayoutBytes(layout);
  auto buffer = c.CreateHostBuffer(bytes);
  REQUIRE(buffer.ok());
  std::memset((*buffer)->data(), kPoison, bytes);
  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(bytes);
  spec.set_writable(true);
  *spec.mutable_paged_kv() = layout;
  auto info = c.RegisterHostBuffer(**buffer, spec);
  REQUIRE(info.ok());
  auto grant = c.CreateGrant(info->region_id(), v1::GRANT_ACCESS_WRITE);
  INFO(grant.status().ToString());
  REQUIRE(grant.ok());

  Child producer({daemon.socket(), "producer", absl::StrCat(info->region_id()), grant->token(),
                  absl::StrCat(kLayers)});
  const std::vector<uint64_t> ids = Ids(producer.Line());
  REQUIRE(ids.size() == 1);
  // Layer 0 lands; the others wait for readiness that never comes.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  uint32_t layers_done = 0;
  while (layers_done < 1 && std::chrono::steady_clock::now() < until) {
    auto s = c.Get(ids[0]);
    REQUIRE(s.ok());
    layers_done = s->layers_done();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(layers_done == 1);
  auto running = c.Get(ids[0]);
  REQUIRE(running.ok());
  CHECK_FALSE(client::IsFinal(running->state()));

  const auto killed = std::chrono::steady_clock::now();
  producer.Kill();
  const v1::TransferStatus end = AwaitEnd(c, ids[0], 30);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  INFO(v1::TransferState_Name(end.state()) << ": " << end.error_message());
  CHECK(end.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(end.error_message().find("ready") != std::string::npos);  // says why
  CHECK(seconds < 5);  // at once, not at a deadline (it has none)

  // Layer 0 of the destination blocks holds the producer's bytes; every other byte is poison.
  std::vector<uint8_t> expected(bytes, kPoison);
  FillFaultPattern(layout, expected.data());
  // FillFaultPattern wrote every layer: put layers 1.. back to poison.
  const uint64_t layer_bytes = bytes / kLayers;  // LAYER_PART_BLOCK order: layers are contiguous
  std::memset(expected.data() + layer_bytes, kPoison, bytes - layer_bytes);
  const uint8_t* got = (*buffer)->data();
  uint64_t first = bytes;
  for (uint64_t i = 0; i < bytes; ++i) {
    if (got[i] != expected[i]) {
      first = i;
      break;
    }
  }
  INFO("first differing byte " << first << " of " << bytes << " (layer " << first / layer_bytes
                               << ")");
  CHECK(first == bytes);

  // The daemon still serves, and stops cleanly.
  CHECK(c.GetStats().ok());
  connected->reset();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail::testing
