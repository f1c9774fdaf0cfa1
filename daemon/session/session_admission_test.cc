// SUBMITs admitted off the poll thread, through the server (a fake `submit` stands in for the
// transfer manager): a session's pipelined packets are admitted and answered in the order sent;
// another tenant's submits are answered while one tenant's admission is still running; a session
// closed with SUBMITs queued has none of them admitted, and ends only after the one running; a
// CANCEL follows the session's SUBMITs and runs on a worker, not holding up other tenants; a
// session's full queue refuses, naming the cap; a SUBMIT naming more than kBulkIds ids is
// admitted by the bulk worker (SCHED_IDLE), a smaller one never.
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/unique_fd.h"
#include "daemon/session/admission.h"
#include "daemon/session/session_server.h"
#include "wire/session_wire.h"

namespace kvrail::session {
namespace {

// The spec's src.region_id of the submit the fake holds until released (the "large" one).
constexpr uint64_t kHeld = 999999;

// A fake transfer manager: records each admitted spec (session id, src.region_id) in order and
// answers with transfer_id = src.region_id; holds kHeld until `release`.
struct FakeAdmission {
  absl::Mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> admitted ABSL_GUARDED_BY(mu);
  absl::Notification held_entered, release;

  SessionServer::SubmitFn Fn() {
    return [this](const v1::TransferSpec& spec) -> absl::StatusOr<v1::SubmitTransferResponse> {
      if (spec.src().region_id() == kHeld) {
        held_entered.Notify();
        release.WaitForNotification();
      }
      {
        absl::MutexLock lock(&mu);
        admitted.emplace_back(spec.session_id(), spec.src().region_id());
      }
      v1::SubmitTransferResponse response;
      response.set_transfer_id(spec.src().region_id());
      return response;
    };
  }
  std::vector<uint64_t> Of(uint64_t session) {
    absl::MutexLock lock(&mu);
    std::vector<uint64_t> out;
    for (const auto& [s, r] : admitted) {
      if (s == session) out.push_back(r);
    }
    return out;
  }
};

struct Served {
  std::string dir;
  std::unique_ptr<sessions::SessionTable> sessions = sessions::SessionTable::Create();
  std::unique_ptr<SessionServer> server;
  std::string path() const { return dir + "/s.session"; }
  explicit Served(SessionServerOptions options) {
    char tmpl[] = "/tmp/kvrail-admission-test.XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    options.path = path();
    auto started = SessionServer::Start(options, sessions.get());
    REQUIRE(started.ok());
    server = *std::move(started);
  }
  ~Served() {
    server.reset();
    ::unlink(path().c_str());
    ::rmdir(dir.c_str());
  }
  // A new session's connection (its id in *id).
  UniqueFd Open(uint64_t* id) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    REQUIRE(fd.valid());
    timeval tv{10, 0};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path().c_str(), path().size() + 1);
    REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    absl::StatusOr<std::string> greeting = wire::ReceivePacket(fd.get());
    REQUIRE(greeting.ok());
    absl::StatusOr<uint64_t> session = wire::ParseGreeting(*greeting);
    REQUIRE(session.ok());
    *id = *session;
    return fd;
  }
  template <typename F>
  bool Eventually(F done) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (!done()) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }
};

// A SUBMIT tagged src.region_id = `tag`; with `shared_table` its ids are in a shared block table
// (a large one: admitted by a worker), else 4 ids in the packet (admitted on the poll thread when
// its session has nothing queued and max_inline_submit_ids allows). kHeld always has a table.
std::string SubmitPacket(uint64_t tag, bool shared_table = false) {
  v1::SubmitTransferRequest request;
  v1::TransferSpec& spec = *request.mutable_spec();
  spec.mutable_src()->set_region_id(tag);
  if (shared_table || tag == kHeld) {
    spec.mutable_src()->mutable_block_table()->set_count(1 << 20);
    spec.mutable_dst()->mutable_block_table()->set_count(1 << 20);
  } else {
    for (uint32_t id : {1, 2}) {
      spec.mutable_src()->add_block_ids(id);
      spec.mutable_dst()->add_block_ids(id);
    }
  }
  return wire::EncodeSubmit(request);
}

// The transfer id a SUBMITTED answer names, or the status it was refused with.
absl::StatusOr<uint64_t> Answer(int fd) {
  absl::StatusOr<std::string> packet = wire::ReceivePacket(fd);
  if (!packet.ok()) return packet.status();
  absl::StatusOr<v1::SubmitTransferResponse> response = wire::ParseSubmitAnswer(*packet);
  if (!response.ok()) return response.status();
  return response->transfer_id();
}

TEST_CASE("a session's pipelined SUBMITs are admitted and answered in the order sent") {
  FakeAdmission fake;
  SessionServerOptions options;
  options.submit = fake.Fn();
  options.admission_workers = 4;
  options.max_queued_per_session = 256;
  // Every SUBMIT by a worker, or small ones on the poll thread whenever their session is idle.
  options.max_inline_submit_ids = GENERATE(0, 1024);
  Served s(options);
  constexpr int kSessions = 3, kSubmits = 100;
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> ids(kSessions);
  for (int c = 0; c < kSessions; ++c) fds.push_back(s.Open(&ids[c]));
  // Each session sends all its SUBMITs before reading an answer; the sessions interleave.
  for (int i = 1; i <= kSubmits; ++i) {
    for (int c = 0; c < kSessions; ++c) {
      REQUIRE(wire::SendPacket(fds[c].get(), SubmitPacket(c * 1000 + i, i % 7 == 0)).ok());
    }
  }
  for (int c = 0; c < kSessions; ++c) {
    for (int i = 1; i <= kSubmits; ++i) {
      absl::StatusOr<uint64_t> answer = Answer(fds[c].get());
      REQUIRE(answer.ok());
      CHECK(*answer == static_cast<uint64_t>(c * 1000 + i));
    }
    std::vector<uint64_t> expected;
    for (int i = 1; i <= kSubmits; ++i) expected.push_back(c * 1000 + i);
    CHECK(fake.Of(ids[c]) == expected);
  }
}

TEST_CASE("another tenant's SUBMITs are answered while one tenant's admission runs") {
  FakeAdmission fake;
  SessionServerOptions options;
  options.submit = fake.Fn();
  options.admission_workers = 2;
  Served s(options);
  uint64_t large_id = 0, small_id = 0;
  UniqueFd large = s.Open(&large_id);
  UniqueFd small = s.Open(&small_id);
  REQUIRE(wire::SendPacket(large.get(), SubmitPacket(kHeld)).ok());
  REQUIRE(fake.held_entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // The large tenant's admission holds a worker; the small tenant's round trips go on.
  for (int i = 1; i <= 50; ++i) {
    REQUIRE(wire::SendPacket(small.get(), SubmitPacket(i)).ok());
    absl::StatusOr<uint64_t> answer = Answer(small.get());
    REQUIRE(answer.ok());
    CHECK(*answer == static_cast<uint64_t>(i));
  }
  CHECK(fake.Of(large_id).empty());  // still being admitted
  fake.release.Notify();
  absl::StatusOr<uint64_t> answer = Answer(large.get());
  REQUIRE(answer.ok());
  CHECK(*answer == kHeld);
}

TEST_CASE(
    "a CANCEL follows the SUBMIT before it and runs on a worker: another tenant's "
    "SUBMITs are answered meanwhile") {
  FakeAdmission fake;
  // Ending a large transfer takes a while: the fake holds each cancel until the gate opens.
  absl::Mutex gate_mu;
  int entered = 0;
  bool open = false;
  uint64_t last = 0;
  SessionServerOptions options;
  options.submit = fake.Fn();
  options.admission_workers = 2;
  options.max_inline_submit_ids = 1024;  // the small tenant's SUBMITs on the poll thread
  options.cancel = [&](const sessions::Caller&, uint64_t id) -> absl::StatusOr<v1::TransferStatus> {
    absl::MutexLock lock(&gate_mu);
    ++entered;
    gate_mu.Await(absl::Condition(&open));
    last = id;
    v1::TransferStatus status;
    status.set_transfer_id(id);
    status.set_state(v1::TRANSFER_STATE_CANCELLED);
    return status;
  };
  const auto entered_is = [&](int n) {
    absl::MutexLock lock(&gate_mu);
    return entered == n;
  };
  const auto set_open = [&](bool value) {
    absl::MutexLock lock(&gate_mu);
    open = value;
  };
  Served s(options);
  // A failed check leaves no cancel held: the server's destruction waits for it.
  absl::Cleanup open_at_exit = [&] { set_open(true); };
  uint64_t large_id = 0, small_id = 0;
  UniqueFd large = s.Open(&large_id);
  UniqueFd small = s.Open(&small_id);
  const auto small_round_trips = [&] {
    for (int i = 1; i <= 50; ++i) {
      REQUIRE(wire::SendPacket(small.get(), SubmitPacket(i)).ok());
      absl::StatusOr<uint64_t> answer = Answer(small.get());
      REQUIRE(answer.ok());
      CHECK(*answer == static_cast<uint64_t>(i));
    }
  };
  const auto cancel_answer = [&] {
    absl::StatusOr<std::string> packet = wire::ReceivePacket(large.get());
    REQUIRE(packet.ok());
    absl::StatusOr<v1::TransferStatus> status = wire::ParseCancelAnswer(*packet, nullptr);
    REQUIRE(status.ok());
    CHECK(status->transfer_id() == kHeld);
    CHECK(status->state() == v1::TRANSFER_STATE_CANCELLED);
  };

  // Pipelined behind its SUBMIT (held in admission), the CANCEL waits for it.
  REQUIRE(wire::SendPacket(large.get(), SubmitPacket(kHeld)).ok());
  REQUIRE(wire::SendPacket(large.get(), wire::EncodeCancel(kHeld)).ok());
  REQUIRE(fake.held_entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(20));
  CHECK(entered_is(0));
  fake.release.Notify();
  absl::StatusOr<uint64_t> submitted = Answer(large.get());
  REQUIRE(submitted.ok());
  CHECK(*submitted == kHeld);
  REQUIRE(s.Eventually([&] { return entered_is(1); }));
  small_round_trips();
  set_open(true);
  cancel_answer();

  // A CANCEL from a session with nothing queued also runs on a worker: while it is held, the
  // poll thread serves the other tenant (served on the poll thread, these round trips would
  // wait for it).
  set_open(false);
  REQUIRE(wire::SendPacket(large.get(), wire::EncodeCancel(kHeld)).ok());
  REQUIRE(s.Eventually([&] { return entered_is(2); }));
  small_round_trips();
  set_open(true);
  cancel_answer();
  absl::MutexLock lock(&gate_mu);
  CHECK(last == kHeld);
}

// The shape of a 16 MiB critical transfer of 16 KiB blocks: 1,024 ids a side, in the packet.
// Its admission on the poll thread costs less than the hand-off to a worker (on an H100 host the
// hand-off added 30-45 us to such a transfer's 100 us), so by default it is admitted there.
TEST_CASE("a 1,024-block transfer's SUBMIT is admitted on the poll thread by default") {
  FakeAdmission fake;
  SessionServerOptions options;
  options.submit = fake.Fn();
  options.admission_workers = 1;  // held by the other tenant's SUBMIT below
  Served s(options);
  uint64_t large_id = 0, small_id = 0;
  UniqueFd large = s.Open(&large_id);
  UniqueFd small = s.Open(&small_id);
  REQUIRE(wire::SendPacket(large.get(), SubmitPacket(kHeld)).ok());
  REQUIRE(fake.held_entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  v1::SubmitTransferRequest request;
  request.mutable_spec()->mutable_src()->set_region_id(7);
  for (uint32_t id = 0; id < 1024; ++id) {
    request.mutable_spec()->mutable_src()->add_block_ids(id);
    request.mutable_spec()->mutable_dst()->add_block_ids(4095 - id);
  }
  REQUIRE(wire::SendPacket(small.get(), wire::EncodeSubmit(request)).ok());
  // Answered while the only worker is still held: it never went to the worker.
  absl::StatusOr<uint64_t> answer = Answer(small.get());
  fake.release.Notify();
  REQUIRE(answer.ok());
  CHECK(*answer == 7u);
  REQUIRE(Answer(large.get()).ok());
  CHECK(fake.Of(large_id) == std::vector<uint64_t>{kHeld});
}

TEST_CASE("a session closed with SUBMITs queued has none admitted; it ends after the running one") {
  FakeAdmission fake;
  SessionServerOptions options;
  options.submit = fake.Fn();
  options.admission_workers = 2;
  Served s(options);
  uint64_t id = 0;
  UniqueFd fd = s.Open(&id);
  REQUIRE(wire::SendPacket(fd.get(), SubmitPacket(kHeld)).ok());
  REQUIRE(fake.held_entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (int i = 1; i <= 5; ++i) REQUIRE(wire::SendPacket(fd.get(), SubmitPacket(i)).ok());
  // A packet of another kind behind them is queued too (its answer must follow theirs).
  REQUIRE(wire::SendPacket(fd.get(), wire::EncodeWait(1)).ok());
  REQUIRE(s.Eventually([&] { return s.server->admissions_queued() == 6; }));
  fd = UniqueFd();  // the client goes away
  REQUIRE(s.Eventually([&] { return s.server->active_sessions() == 0; }));
  CHECK(s.server->admissions_queued() == 0);  // dropped, not run
  // The session ends once the admission in progress returns, not before: a transfer admitted
  // after its end would escape the session's end (which stops what writes into its memory).
  CHECK(s.sessions->SessionOpen(id));
  fake.release.Notify();
  REQUIRE(s.Eventually([&] { return !s.sessions->SessionOpen(id); }));
  CHECK(fake.Of(id) == std::vector<uint64_t>{kHeld});
}

TEST_CASE("a session's full admission queue refuses the next packet at once, naming the cap") {
  FakeAdmission fake;
  SessionServerOptions options;
  options.submit = fake.Fn();
  options.admission_workers = 1;
  options.max_queued_per_session = 2;
  Served s(options);
  uint64_t id = 0;
  UniqueFd fd = s.Open(&id);
  REQUIRE(wire::SendPacket(fd.get(), SubmitPacket(kHeld)).ok());
  REQUIRE(fake.held_entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (int i = 1; i <= 3; ++i) REQUIRE(wire::SendPacket(fd.get(), SubmitPacket(i)).ok());
  // Two queue behind the running one; the third is refused before any of them is answered.
  absl::StatusOr<uint64_t> refused = Answer(fd.get());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(refused.status().message().rfind("admission queue: this session has 2 packets queued", 0) ==
        0);
  fake.release.Notify();
  for (uint64_t expected : {kHeld, uint64_t{1}, uint64_t{2}}) {
    absl::StatusOr<uint64_t> answer = Answer(fd.get());
    REQUIRE(answer.ok());
    CHECK(*answer == expected);
  }
  CHECK(fake.Of(id) == std::vector<uint64_t>{kHeld, 1, 2});
}

TEST_CASE("small SUBMITs of an idle session are admitted on the poll thread, others by workers") {
  FakeAdmission fake;
  SessionServerOptions options;
  options.submit = fake.Fn();
  options.admission_workers = 1;
  Served s(options);
  uint64_t a_id = 0, b_id = 0;
  UniqueFd a = s.Open(&a_id);
  UniqueFd b = s.Open(&b_id);
  REQUIRE(wire::SendPacket(a.get(), SubmitPacket(kHeld)).ok());
  REQUIRE(fake.held_entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // The only worker is held: b's small SUBMITs are answered all the same (on the poll thread)...
  for (uint64_t i = 1; i <= 3; ++i) {
    REQUIRE(wire::SendPacket(b.get(), SubmitPacket(i)).ok());
    absl::StatusOr<uint64_t> answer = Answer(b.get());
    REQUIRE(answer.ok());
    CHECK(*answer == i);
  }
  // ...its SUBMIT with a shared table waits for the worker, and its small one behind it follows.
  REQUIRE(wire::SendPacket(b.get(), SubmitPacket(4, /*shared_table=*/true)).ok());
  REQUIRE(wire::SendPacket(b.get(), SubmitPacket(5)).ok());
  REQUIRE(s.Eventually([&] { return s.server->admissions_queued() == 2; }));
  CHECK(fake.Of(b_id) == std::vector<uint64_t>{1, 2, 3});
  fake.release.Notify();
  for (uint64_t expected : {uint64_t{4}, uint64_t{5}}) {
    absl::StatusOr<uint64_t> answer = Answer(b.get());
    REQUIRE(answer.ok());
    CHECK(*answer == expected);
  }
  CHECK(fake.Of(b_id) == std::vector<uint64_t>{1, 2, 3, 4, 5});
  CHECK(*Answer(a.get()) == kHeld);
}

TEST_CASE("with admission_workers 0 SUBMITs are admitted on the poll thread, in order") {
  FakeAdmission fake;
  SessionServerOptions options;
  options.submit = fake.Fn();
  options.admission_workers = 0;
  Served s(options);
  uint64_t id = 0;
  UniqueFd fd = s.Open(&id);
  for (int i = 1; i <= 20; ++i) REQUIRE(wire::SendPacket(fd.get(), SubmitPacket(i)).ok());
  for (int i = 1; i <= 20; ++i) {
    absl::StatusOr<uint64_t> answer = Answer(fd.get());
    REQUIRE(answer.ok());
    CHECK(*answer == static_cast<uint64_t>(i));
  }
  CHECK(s.server->admissions_queued() == 0);
}

TEST_CASE("a SUBMIT naming more than kBulkIds ids is admitted in SCHED_IDLE, smaller ones not") {
  const size_t bulk_workers = GENERATE(1, 0);
  absl::Mutex mu;
  std::vector<std::pair<uint64_t, int>> policies;  // (src.region_id, the admitting policy)
  SessionServerOptions options;
  options.submit = [&](const v1::TransferSpec& spec) -> absl::StatusOr<v1::SubmitTransferResponse> {
    const int policy = ::sched_getscheduler(0);
    absl::MutexLock lock(&mu);
    policies.emplace_back(spec.src().region_id(), policy);
    v1::SubmitTransferResponse response;
    response.set_transfer_id(spec.src().region_id());
    return response;
  };
  options.admission_workers = 2;
  options.admission_bulk_workers = bulk_workers;
  options.max_inline_submit_ids = 0;  // every SUBMIT to a worker
  Served s(options);
  uint64_t id = 0;
  UniqueFd fd = s.Open(&id);
  // 1: 2^20 ids a side in shared tables; 2: exactly kBulkIds in tables; 3: ids in the packet;
  // 4: kBulkIds + 1 ids, half le32 in the packet (one side), the rest in a table (the other).
  v1::SubmitTransferRequest at_bound;
  at_bound.mutable_spec()->mutable_src()->set_region_id(2);
  at_bound.mutable_spec()->mutable_src()->mutable_block_table()->set_count(kBulkIds / 2);
  at_bound.mutable_spec()->mutable_dst()->mutable_block_table()->set_count(kBulkIds / 2);
  v1::SubmitTransferRequest over;
  over.mutable_spec()->mutable_src()->set_region_id(4);
  over.mutable_spec()->mutable_src()->set_block_ids_le32(std::string(4 * (kBulkIds / 2), '\0'));
  over.mutable_spec()->mutable_dst()->mutable_block_table()->set_count(kBulkIds / 2 + 1);
  const std::string packets[] = {SubmitPacket(1, /*shared_table=*/true),
                                 wire::EncodeSubmit(at_bound), SubmitPacket(3),
                                 wire::EncodeSubmit(over)};
  for (const std::string& packet : packets) {
    REQUIRE(wire::SendPacket(fd.get(), packet).ok());
    absl::StatusOr<uint64_t> answer = Answer(fd.get());
    REQUIRE(answer.ok());
  }
  absl::MutexLock lock(&mu);
  REQUIRE(policies.size() == 4);
  const int base = ::sched_getscheduler(0);
  REQUIRE(base != SCHED_IDLE);
  const int bulk = bulk_workers > 0 ? SCHED_IDLE : base;
  CHECK(policies[0] == std::make_pair(uint64_t{1}, bulk));
  CHECK(policies[1] == std::make_pair(uint64_t{2}, base));
  CHECK(policies[2] == std::make_pair(uint64_t{3}, base));
  CHECK(policies[3] == std::make_pair(uint64_t{4}, bulk));
}

}  // namespace
}  // namespace kvrail::session
