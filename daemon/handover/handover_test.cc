// The handover protocol without daemons: bundles on the wire (state and descriptors), the uid
// rule, and a listener with fake predecessor callbacks (commit, a successor that goes away, a
// refusal).
#include "daemon/handover/handover.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace kvrail::handover {
namespace {

std::pair<UniqueFd, UniqueFd> SocketPair() {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// A memfd holding `text`.
UniqueFd MemfdWith(const std::string& text) {
  UniqueFd fd(::memfd_create("handover-test", MFD_CLOEXEC));
  REQUIRE(fd.valid());
  REQUIRE(::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  return fd;
}

std::string ReadAll(int fd) {
  char buffer[64] = {};
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer), 0);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
}

Bundle MakeBundle(int fds, int sessions) {
  Bundle bundle;
  bundle.state.set_lineage_id("lineage");
  for (int i = 0; i < sessions; ++i) {
    SessionRecord* s = bundle.state.mutable_regions()->add_sessions();
    s->set_session_id(1000 + i);
    s->set_secret(std::string(32, 'a' + i % 26));
    s->set_uid(i);
  }
  for (int i = 0; i < fds; ++i) {
    bundle.fds.push_back(MemfdWith(absl::StrCat("fd ", i)));
    bundle.state.mutable_regions()->add_pending_fds()->set_fd(i);
  }
  return bundle;
}

TEST_CASE("a bundle crosses the socket whole: the message in chunks, every descriptor in order") {
  auto [a, b] = SocketPair();
  // 200 descriptors (several packets of 64) and a message of several 32 KiB chunks.
  Bundle sent = MakeBundle(200, 3000);
  std::thread sender([&] { REQUIRE(SendBundle(a.get(), sent).ok()); });
  absl::StatusOr<Bundle> got = ReceiveBundle(b.get(), absl::Seconds(10));
  sender.join();
  REQUIRE(got.ok());
  CHECK(got->state.SerializeAsString() == sent.state.SerializeAsString());
  REQUIRE(got->fds.size() == 200);
  for (int i = 0; i < 200; ++i) CHECK(ReadAll(got->fds[i].get()) == absl::StrCat("fd ", i));
}

TEST_CASE("a bundle that does not add up is refused, naming why") {
  auto [a, b] = SocketPair();
  SECTION("malformed header") {
    REQUIRE(::send(a.get(), "BUNDLE x y", 10, 0) == 10);
    absl::StatusOr<Bundle> got = ReceiveBundle(b.get(), absl::Seconds(2));
    CHECK(got.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(got.status().message()).find("header") != std::string::npos);
  }
  SECTION("the sender goes away halfway") {
    REQUIRE(::send(a.get(), "BUNDLE 100 0", 12, 0) == 12);
    REQUIRE(::send(a.get(), "DATAxx", 6, 0) == 6);
    a = UniqueFd();
    absl::StatusOr<Bundle> got = ReceiveBundle(b.get(), absl::Seconds(2));
    CHECK(got.status().code() == absl::StatusCode::kUnavailable);
  }
  SECTION("nothing comes") {
    absl::StatusOr<Bundle> got = ReceiveBundle(b.get(), absl::Milliseconds(50));
    CHECK(got.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
  SECTION("the predecessor refuses") {
    REQUIRE(::send(a.get(), "REFUSED 3 transfers still run", 29, 0) == 29);
    absl::StatusOr<Bundle> got = ReceiveBundle(b.get(), absl::Seconds(2));
    CHECK(got.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(got.status().message()).find("3 transfers still run") != std::string::npos);
  }
}

TEST_CASE("only the same uid, or root, takes part in a handover") {
  CHECK(CheckPeerUid(1000, 1000).ok());
  CHECK(CheckPeerUid(0, 1000).ok());
  CHECK(CheckPeerUid(0, 0).ok());
  const absl::Status other = CheckPeerUid(1001, 1000);
  CHECK(other.code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(other.message()).find("uid 1001") != std::string::npos);
  CHECK(CheckPeerUid(65534, 0).code() == absl::StatusCode::kPermissionDenied);
}

// A temporary directory for the handover socket.
struct Dir {
  std::string path;
  Dir() {
    char tmpl[] = "/tmp/handover-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~Dir() { (void)!std::system(("rm -rf " + path).c_str()); }
};

struct Calls {
  std::atomic<int> prepared{0}, resumed{0}, released{0};
};

Predecessor Fake(Calls* calls, absl::Status refuse = absl::OkStatus()) {
  Predecessor p;
  p.prepare = [calls, refuse]() -> absl::StatusOr<Bundle> {
    ++calls->prepared;
    if (!refuse.ok()) return refuse;
    return MakeBundle(3, 2);
  };
  p.resume = [calls] { ++calls->resumed; };
  p.released = [calls](const std::string& address) {
    if (address == "unix:/successor") ++calls->released;
  };
  return p;
}

TEST_CASE("a successor that commits gets the bundle; the predecessor is released, not resumed") {
  Dir dir;
  const std::string path = HandoverSocketPath(dir.path + "/kvrail.sock");
  Calls calls;
  auto listener = Listener::Start(path, Fake(&calls), absl::Seconds(5));
  REQUIRE(listener.ok());
  auto takeover = Takeover::Begin(path, absl::Seconds(5));
  REQUIRE(takeover.ok());
  CHECK((*takeover)->bundle().state.lineage_id() == "lineage");
  REQUIRE((*takeover)->bundle().fds.size() == 3);
  CHECK(ReadAll((*takeover)->bundle().fds[2].get()) == "fd 2");
  CHECK(calls.released.load() == 0);  // nothing lets go before the commit
  REQUIRE((*takeover)->Commit(absl::Seconds(5), "unix:/successor").ok());
  CHECK(calls.prepared.load() == 1);
  CHECK(calls.released.load() == 1);
  CHECK(calls.resumed.load() == 0);
  CHECK((*listener)->released());
}

TEST_CASE("a successor that goes away before committing leaves the predecessor serving") {
  Dir dir;
  const std::string path = HandoverSocketPath(dir.path + "/kvrail.sock");
  Calls calls;
  auto listener = Listener::Start(path, Fake(&calls), absl::Seconds(5));
  REQUIRE(listener.ok());
  {
    auto takeover = Takeover::Begin(path, absl::Seconds(5));
    REQUIRE(takeover.ok());
  }  // closed without a commit
  for (int i = 0; i < 500 && calls.resumed.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(2));
  CHECK(calls.resumed.load() == 1);
  CHECK(calls.released.load() == 0);
  CHECK_FALSE((*listener)->released());
  // The next successor is served.
  auto again = Takeover::Begin(path, absl::Seconds(5));
  REQUIRE(again.ok());
  REQUIRE((*again)->Commit(absl::Seconds(5), "unix:/successor").ok());
  CHECK(calls.released.load() == 1);
}

TEST_CASE("a predecessor that cannot prepare refuses with its reason and serves on") {
  Dir dir;
  const std::string path = HandoverSocketPath(dir.path + "/kvrail.sock");
  Calls calls;
  auto listener = Listener::Start(
      path, Fake(&calls, absl::FailedPreconditionError("2 transfers still run")), absl::Seconds(5));
  REQUIRE(listener.ok());
  auto takeover = Takeover::Begin(path, absl::Seconds(5));
  REQUIRE_FALSE(takeover.ok());
  CHECK(takeover.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(takeover.status().message()).find("2 transfers still run") !=
        std::string::npos);
  for (int i = 0; i < 500 && calls.resumed.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(2));
  CHECK(calls.resumed.load() == 1);
  CHECK_FALSE((*listener)->released());
}

TEST_CASE("nothing listening is UNAVAILABLE naming the path") {
  Dir dir;
  auto takeover = Takeover::Begin(dir.path + "/none.handover", absl::Seconds(1));
  CHECK(takeover.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(takeover.status().message()).find("none.handover") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::handover
