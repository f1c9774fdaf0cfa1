// The notification hub on its own: who receives, bounded queues with a dropped count, sessions
// that are not open, waits, and a session's end dropping its queue.
#include "daemon/transfers/notifications.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace kvrail::transfers {
namespace {

// Sessions a test opens and closes by hand. Thread-safe.
class Sessions {
 public:
  void Open(uint64_t id) {
    absl::MutexLock lock(&mu_);
    open_.insert(id);
  }
  void Close(uint64_t id) {
    absl::MutexLock lock(&mu_);
    open_.erase(id);
  }
  std::function<bool(uint64_t)> Fn() {
    return [this](uint64_t id) {
      absl::MutexLock lock(&mu_);
      return open_.count(id) > 0;
    };
  }

 private:
  absl::Mutex mu_;
  std::set<uint64_t> open_ ABSL_GUARDED_BY(mu_);
};

v1::Notification Named(uint64_t transfer_id) {
  v1::Notification n;
  n.set_transfer_id(transfer_id);
  n.set_notification("req-" + std::to_string(transfer_id));
  return n;
}

TEST_CASE("recipients: the owner of the region the submitter does not own") {
  using R = NotificationRecipient;
  // Decode (session 2, dst region 20) pulls from prefill (session 1, src region 10).
  CHECK(NotificationRecipients(10, 1, 20, 2, 2) == std::vector<R>{{1, 10, true}});
  // Prefill pushes into decode's region.
  CHECK(NotificationRecipients(10, 1, 20, 2, 1) == std::vector<R>{{2, 20, false}});
  // The submitter owns both: nobody.
  CHECK(NotificationRecipients(10, 1, 20, 1, 1).empty());
  // Submitter unknown: both owners, the destination first.
  CHECK(NotificationRecipients(10, 1, 20, 2, 0) == std::vector<R>{{2, 20, false}, {1, 10, true}});
  // A third session owning both regions of someone else's transfer: once, for the destination.
  CHECK(NotificationRecipients(10, 3, 20, 3, 2) == std::vector<R>{{3, 20, false}});
  // Regions without a session (or on another node: owner 0) receive nothing.
  CHECK(NotificationRecipients(10, 0, 20, 2, 2).empty());
  CHECK(NotificationRecipients(10, 1, 20, 0, 0) == std::vector<R>{{1, 10, true}});
}

TEST_CASE("spec.notification is limited to 1024 bytes") {
  v1::TransferSpec spec;
  spec.set_notification(std::string(kMaxNotificationBytes, 'x'));
  CHECK(CheckNotification(spec).ok());
  spec.set_notification(std::string(kMaxNotificationBytes + 1, 'x'));
  const absl::Status status = CheckNotification(spec);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message().find("spec.notification") == 0);
}

TEST_CASE("a session's queue is oldest first and only its own") {
  Sessions sessions;
  sessions.Open(1);
  sessions.Open(2);
  auto hub = NotificationHub::Create(sessions.Fn());
  CHECK(hub->Deliver(1, Named(100)));
  CHECK(hub->Deliver(1, Named(101)));
  CHECK(hub->Deliver(2, Named(200)));
  auto one = hub->Take(1, 0, absl::ZeroDuration());
  REQUIRE(one.ok());
  REQUIRE(one->size() == 2);
  CHECK((*one)[0].transfer_id() == 100);
  CHECK((*one)[1].transfer_id() == 101);
  CHECK((*one)[0].dropped() == 0);
  auto two = hub->Take(2, 0, absl::ZeroDuration());
  REQUIRE(two.ok());
  REQUIRE(two->size() == 1);
  CHECK((*two)[0].notification() == "req-200");
  // Taken once: nothing left.
  CHECK(hub->Take(1, 0, absl::ZeroDuration())->empty());
  // `max` caps one take.
  for (uint64_t i = 0; i < 5; ++i) hub->Deliver(1, Named(i));
  CHECK(hub->Take(1, 3, absl::ZeroDuration())->size() == 3);
  CHECK(hub->Take(1, 3, absl::ZeroDuration())->size() == 2);
}

TEST_CASE("a full queue drops the oldest and says so in the next notification taken") {
  Sessions sessions;
  sessions.Open(1);
  auto hub = NotificationHub::Create(sessions.Fn(), /*queue_limit=*/4);
  for (uint64_t i = 0; i < 7; ++i) CHECK(hub->Deliver(1, Named(i)));
  CHECK(hub->Queued(1) == 4);
  auto taken = hub->Take(1, 0, absl::ZeroDuration());
  REQUIRE(taken.ok());
  REQUIRE(taken->size() == 4);
  CHECK((*taken)[0].transfer_id() == 3);  // 0, 1, 2 dropped
  CHECK((*taken)[0].dropped() == 3);
  CHECK((*taken)[1].dropped() == 0);
  CHECK((*taken)[3].transfer_id() == 6);
  // The count was reported once.
  hub->Deliver(1, Named(7));
  CHECK(hub->Take(1, 0, absl::ZeroDuration())->at(0).dropped() == 0);
}

TEST_CASE("sessions that are not open get nothing and cannot be read") {
  Sessions sessions;
  sessions.Open(1);
  auto hub = NotificationHub::Create(sessions.Fn());
  CHECK_FALSE(hub->Deliver(9, Named(1)));
  CHECK_FALSE(hub->Deliver(0, Named(1)));
  CHECK(hub->QueueCount() == 0);
  const auto status = hub->Take(9, 0, absl::ZeroDuration()).status();
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK(status.message().find("session_id") == 0);
}

TEST_CASE("ending a session drops its queue and wakes its waiter") {
  Sessions sessions;
  sessions.Open(1);
  auto hub = NotificationHub::Create(sessions.Fn());
  hub->Deliver(1, Named(1));
  CHECK(hub->QueueCount() == 1);
  std::atomic<bool> returned{false};
  absl::StatusOr<std::vector<v1::Notification>> waited;
  (void)hub->Take(1, 0, absl::ZeroDuration());  // empty again
  std::thread waiter([&] {
    waited = hub->Take(1, 0, absl::Hours(1));
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(20));
  CHECK_FALSE(returned.load());
  sessions.Close(1);
  hub->EndSession(1);
  waiter.join();
  CHECK(waited.status().code() == absl::StatusCode::kNotFound);
  CHECK(hub->QueueCount() == 0);
  CHECK_FALSE(hub->Deliver(1, Named(2)));  // a late delivery does not bring it back
  CHECK(hub->QueueCount() == 0);
}

TEST_CASE("a waiting take returns when a notification arrives") {
  Sessions sessions;
  sessions.Open(1);
  auto hub = NotificationHub::Create(sessions.Fn());
  absl::StatusOr<std::vector<v1::Notification>> waited;
  std::thread waiter([&] { waited = hub->Take(1, 0, absl::Hours(1)); });
  absl::SleepFor(absl::Milliseconds(20));
  hub->Deliver(1, Named(5));
  waiter.join();
  REQUIRE(waited.ok());
  REQUIRE(waited->size() == 1);
  CHECK((*waited)[0].transfer_id() == 5);
}

}  // namespace
}  // namespace kvrail::transfers
