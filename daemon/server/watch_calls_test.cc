// The watch calls give back their WatcherCounts slot before their answer can reach the client:
// with a cap of 1, a client that calls again the moment it has its answer is never refused for
// the call that answered it. The answering side is a fake that plays that client: inside Finish
// (the moment gRPC would send the answer) it takes the slot its next call needs.
#include "daemon/server/watch_calls.h"

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/access/access.h"
#include "daemon/regions/regions.h"
#include "daemon/sessions/sessions.h"
#include "daemon/transfers/notifications.h"
#include "daemon/transfers/transfers.h"

namespace kvrail::server {
namespace {

constexpr int kCalls = 20;

// A client that calls again as soon as it has its answer: Finish takes the next call's slot.
// The test keeps this state; the call owns (and may destroy on the pump's thread, once it has
// answered) only the CallingAgainClient in front of it. Thread-safe (Finish runs on the pump's
// thread).
class AnswerState {
 public:
  AnswerState(WatcherCounts* counts, sessions::Caller caller) : counts_(counts), caller_(caller) {}
  void Finish(const grpc::Status& status) {
    absl::StatusOr<WatcherCounts::Slot> next = counts_->Take(caller_);
    absl::MutexLock lock(&mu_);
    code_ = status.error_code();
    next_ = next.status();
    if (next.ok()) next_slot_ = *std::move(next);
    answered_.Notify();
  }
  // Waits for the answer; the next call's refusal (or OK), and the answer's code.
  absl::Status WaitNext(grpc::StatusCode* code) {
    REQUIRE(answered_.WaitForNotificationWithTimeout(absl::Seconds(30)));
    absl::MutexLock lock(&mu_);
    *code = code_;
    return next_;
  }
  // The next call ends (its slot given back).
  void EndNext() {
    absl::MutexLock lock(&mu_);
    next_slot_.reset();
  }

 private:
  WatcherCounts* const counts_;
  const sessions::Caller caller_;
  absl::Notification answered_;
  absl::Mutex mu_;
  grpc::StatusCode code_ ABSL_GUARDED_BY(mu_) = grpc::StatusCode::UNKNOWN;
  absl::Status next_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("not answered");
  WatcherCounts::Slot next_slot_ ABSL_GUARDED_BY(mu_);
};

// The answering side the call owns: hands Finish to the test's AnswerState.
class CallingAgainClient final : public UnaryAnswer {
 public:
  explicit CallingAgainClient(std::shared_ptr<AnswerState> state) : state_(std::move(state)) {}
  bool IsCancelled() const override { return false; }
  void Finish(const grpc::Status& status) override { state_->Finish(status); }

 private:
  const std::shared_ptr<AnswerState> state_;
};

struct Daemon {
  std::unique_ptr<sessions::SessionTable> sessions = sessions::SessionTable::Create();
  std::unique_ptr<regions::RegionTable> regions =
      regions::RegionTable::Create(Clock::Real(), sessions.get());
  std::unique_ptr<access::Grants> grants =
      access::Grants::Create(Clock::Real(), sessions.get(), regions.get());
  std::unique_ptr<transfers::TransferManager> manager = transfers::TransferManager::Create(
      regions.get(), grants.get(), transfers::EngineRegistry{}, Clock::Real(), Options());
  // Every session id is open (a poll of an empty queue waits until its timeout).
  std::unique_ptr<transfers::NotificationHub> hub =
      transfers::NotificationHub::Create([](uint64_t) { return true; });
  std::shared_ptr<WatchPump> pump = std::make_shared<WatchPump>(absl::Milliseconds(1));
  ~Daemon() { manager->Drain(absl::ZeroDuration()); }

  static transfers::Options Options() {
    transfers::Options options;
    options.node_id = "here";
    return options;
  }
};

const sessions::Caller kCaller{.session_id = 7, .uid = 1000};

// kCalls unary calls in a row, each started by `start` with its slot and answering side; each is
// answered `want`, and the client calls again from inside the answer (AnswerState takes the next
// slot in Finish), so a slot given back only after Finish refuses the next call.
void CallAgainFromEachAnswer(
    WatcherCounts& counts, grpc::StatusCode want,
    const std::function<void(std::unique_ptr<UnaryAnswer>, WatcherCounts::Slot)>& start) {
  for (int i = 0; i < kCalls; ++i) {
    INFO("call " << i);
    absl::StatusOr<WatcherCounts::Slot> slot = counts.Take(kCaller);
    REQUIRE(slot.ok());
    auto seen = std::make_shared<AnswerState>(&counts, kCaller);
    start(std::make_unique<CallingAgainClient>(seen), *std::move(slot));
    grpc::StatusCode code;
    const absl::Status next = seen->WaitNext(&code);
    CHECK(code == want);
    INFO("the next call: " << next.ToString());
    REQUIRE(next.ok());  // refused at max_watchers_per_session for the call just answered: a bug
    seen->EndNext();
  }
  CHECK(counts.OpenOfUid(kCaller.uid) == 0);
}

TEST_CASE("a WaitTransfer answered gives back its slot before the client has the answer") {
  WatcherCounts counts(/*max_per_session=*/1, /*max_per_uid=*/1);  // outlives the pump's calls
  Daemon daemon;
  v1::TransferStatus response;  // each call's, one at a time
  // An id that is no transfer: answered NOT_FOUND at the pump's first look.
  CallAgainFromEachAnswer(counts, grpc::StatusCode::NOT_FOUND,
                          [&](std::unique_ptr<UnaryAnswer> client, WatcherCounts::Slot slot) {
                            StartWaitCall(std::move(client), kCaller, /*id=*/424242,
                                          absl::ZeroDuration(), &response, std::move(slot),
                                          daemon.manager.get(), daemon.pump);
                          });
}

TEST_CASE("a PollNotifications answered gives back its slot before the client has the answer") {
  WatcherCounts counts(/*max_per_session=*/1, /*max_per_uid=*/1);  // outlives the pump's calls
  Daemon daemon;
  v1::NotificationPollResponse response;  // each call's, one at a time
  // Nothing queued: answered empty at the timeout.
  CallAgainFromEachAnswer(counts, grpc::StatusCode::OK,
                          [&](std::unique_ptr<UnaryAnswer> client, WatcherCounts::Slot slot) {
                            StartPollCall(std::move(client), kCaller.session_id, 0,
                                          absl::Milliseconds(2), &response, std::move(slot),
                                          daemon.hub.get(), daemon.pump);
                          });
}

// A stream gives its slot back when it finishes, not when gRPC is done with it (OnDone, after the
// client may have its final status and called again). Unbound to a call, the reactor keeps its
// Finish for later; the test plays gRPC's OnDone itself, afterwards.
TEST_CASE("a WatchNotifications stream gives back its slot when it finishes, before OnDone") {
  WatcherCounts counts(/*max_per_session=*/1, /*max_per_uid=*/1);  // outlives the pump's calls
  Daemon daemon;
  // A session that is not open: the stream finishes NOT_FOUND at the pump's first look.
  std::unique_ptr<transfers::NotificationHub> closed =
      transfers::NotificationHub::Create([](uint64_t) { return false; });
  for (int i = 0; i < kCalls; ++i) {
    INFO("call " << i);
    absl::StatusOr<WatcherCounts::Slot> slot = counts.Take(kCaller);
    REQUIRE(slot.ok());
    grpc::ServerWriteReactor<v1::Notification>* stream = StartNotificationWatch(
        nullptr, kCaller.session_id, *std::move(slot), closed.get(), daemon.pump);
    // The stream finishes on the pump's thread; its slot must come back without OnDone.
    std::optional<absl::StatusOr<WatcherCounts::Slot>> next;
    const absl::Time until = absl::Now() + absl::Seconds(10);
    do {
      next.emplace(counts.Take(kCaller));
      if (next->ok()) break;
      absl::SleepFor(absl::Milliseconds(1));
    } while (absl::Now() < until);
    stream->OnDone();  // gRPC's part: the stream is done with
    INFO("the next call: " << next->status().ToString());
    REQUIRE(next->ok());  // not given back until OnDone: a bug
  }
  CHECK(counts.OpenOfUid(kCaller.uid) == 0);
}

}  // namespace
}  // namespace kvrail::server
