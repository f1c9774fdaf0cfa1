#include "daemon/sessions/sessions.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace kvrail::sessions {
namespace {

void RequireError(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  INFO(s.ToString());
  REQUIRE(!s.ok());
  CHECK(s.code() == code);
  CHECK(std::string(s.message()).find(text) != std::string::npos);
}

UniqueFd AnyFd() {
  UniqueFd fd(::memfd_create("sessions_test", MFD_CLOEXEC));
  REQUIRE(fd.valid());
  return fd;
}

TEST_CASE("a daemon's id bases are random multiples of 2^32 below 2^63") {
  constexpr uint64_t k32 = uint64_t{1} << 32;
  const uint64_t base = RandomIdBase();
  CHECK(base >= k32);
  CHECK(base < (uint64_t{1} << 63));
  CHECK(base % k32 == 0);
  // Two daemon starts draw different bases (the chance of equal ones is 2^-31 per pair).
  CHECK((RandomIdBase() != base || RandomIdBase() != base));
}

TEST_CASE("a session's credential names its caller; a wrong or ended one is UNAUTHENTICATED") {
  auto table = SessionTable::Create();
  const uint64_t a = table->BeginSession();
  const uint64_t b = table->BeginSession();
  CHECK(table->SessionOpen(a));
  CHECK(table->SessionSecret(a).size() == 32);
  CHECK(table->SessionSecret(a) != table->SessionSecret(b));
  table->SetSessionPeer(a, 1234);
  auto caller = table->Authenticate(a, table->SessionSecret(a));
  REQUIRE(caller.ok());
  CHECK(caller->session_id == a);
  CHECK(caller->uid == 1234);
  CHECK(table->CallerOf(b).uid == -1);
  RequireError(table->Authenticate(a, table->SessionSecret(b)).status(),
               absl::StatusCode::kUnauthenticated, "kvrail-session");
  const std::string secret = table->SessionSecret(a);
  std::vector<uint64_t> ended;
  std::vector<std::string> order;
  table->AddSessionEndHook([&](uint64_t s) { order.push_back("late"); }, /*after_others=*/true);
  table->AddSessionEndHook([&](uint64_t s) {
    ended.push_back(s);
    order.push_back("first");
  });
  table->EndSession(a);
  table->EndSession(a);  // once only
  CHECK(ended == std::vector<uint64_t>{a});
  CHECK(order == std::vector<std::string>{"first", "late"});
  CHECK(!table->SessionOpen(a));
  CHECK(table->SessionSecret(a).empty());
  RequireError(table->Authenticate(a, secret).status(), absl::StatusCode::kUnauthenticated,
               "not an open session");
}

TEST_CASE("fd tokens are single use and belong to their session; a session's end drops them") {
  auto table = SessionTable::Create();
  const uint64_t a = table->BeginSession();
  const uint64_t b = table->BeginSession();
  auto token = table->AddFd(a, AnyFd());
  REQUIRE(token.ok());
  RequireError(table->TakeFd(*token, b).status(), absl::StatusCode::kPermissionDenied,
               "spec.share.fd_token: the token belongs to another session");
  auto fd = table->TakeFd(*token, a);
  REQUIRE(fd.ok());
  CHECK(fd->valid());
  RequireError(table->TakeFd(*token, a).status(), absl::StatusCode::kNotFound,
               "spec.share.fd_token");
  // Given back after a failed registration, it is usable again.
  table->ReturnFd(*token, a, *std::move(fd));
  CHECK(table->TakeFd(*token, a).ok());
  auto dropped = table->AddFd(a, AnyFd());
  REQUIRE(dropped.ok());
  table->EndSession(a);
  RequireError(table->TakeFd(*dropped, a).status(), absl::StatusCode::kNotFound,
               "spec.share.fd_token");
}

TEST_CASE("one session cannot take every fd token") {
  auto table = SessionTable::Create();
  // Two uids: the sessions of one uid share its cap (max_fd_tokens_per_uid, a quarter of all:
  // as many as one session's), which the next case tries.
  const uint64_t greedy = table->BeginSession();
  table->SetSessionPeer(greedy, 1000);
  const uint64_t other = table->BeginSession();
  table->SetSessionPeer(other, 2000);
  UniqueFd fd = AnyFd();
  int taken = 0;
  absl::Status last;
  for (int i = 0; i < 2000; ++i) {
    auto token = table->AddFd(greedy, UniqueFd(::dup(fd.get())));
    if (!token.ok()) {
      last = token.status();
      break;
    }
    ++taken;
  }
  CHECK(taken == 1024);
  RequireError(last, absl::StatusCode::kResourceExhausted,
               "max_fd_tokens_per_session: the session holds 1024");
  // Another session still gets tokens; the greedy one's go when it ends.
  CHECK(table->AddFd(other, UniqueFd(::dup(fd.get()))).ok());
  table->EndSession(greedy);
  const uint64_t again = table->BeginSession();
  table->SetSessionPeer(again, 1000);
  CHECK(table->AddFd(again, UniqueFd(::dup(fd.get()))).ok());
}

TEST_CASE("several sessions of one uid cannot take every fd token; another uid still gets them") {
  SessionLimits limits;
  limits.max_fd_tokens = 16;
  limits.max_fd_tokens_per_session = 8;
  limits.max_fd_tokens_per_uid = 10;
  auto table = SessionTable::Create(limits);
  std::vector<uint64_t> greedy;
  for (int i = 0; i < 3; ++i) {
    greedy.push_back(table->BeginSession());
    table->SetSessionPeer(greedy.back(), 1000);
  }
  const uint64_t other = table->BeginSession();
  table->SetSessionPeer(other, 2000);
  UniqueFd fd = AnyFd();
  // Each of uid 1000's sessions takes what it can: 8 (its session's cap), then 2, then none.
  std::vector<int> taken;
  absl::Status last;
  for (uint64_t session : greedy) {
    int n = 0;
    for (int i = 0; i < 16; ++i) {
      auto token = table->AddFd(session, UniqueFd(::dup(fd.get())));
      if (!token.ok()) {
        last = token.status();
        break;
      }
      ++n;
    }
    taken.push_back(n);
  }
  CHECK(taken == std::vector<int>{8, 2, 0});
  RequireError(last, absl::StatusCode::kResourceExhausted,
               "max_fd_tokens_per_uid: uid 1000 holds 10 unused fd tokens in all its sessions");
  // Another uid still gets tokens (6 are left of the 16 in all).
  for (int i = 0; i < 6; ++i) CHECK(table->AddFd(other, UniqueFd(::dup(fd.get()))).ok());
  RequireError(table->AddFd(other, UniqueFd(::dup(fd.get()))).status(),
               absl::StatusCode::kResourceExhausted, "max_fd_tokens: kvraild holds 16");
  // A token taken (registered) or a session ended gives uid 1000 room again.
  table->EndSession(greedy[1]);
  CHECK(table->AddFd(greedy[2], UniqueFd(::dup(fd.get()))).ok());
  // kvraild's defaults: a quarter of every token per uid.
  const SessionLimits defaults;
  CHECK(defaults.max_fd_tokens_per_uid * 4 == defaults.max_fd_tokens);
}

}  // namespace
}  // namespace kvrail::sessions
