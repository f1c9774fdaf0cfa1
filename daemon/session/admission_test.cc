// AdmissionPool: each session's tasks run in the order posted and one at a time, sessions in
// parallel; a session closed with tasks queued has none of them run, and its `then` runs only
// after the task that was running; a full queue refuses, naming the cap.
#include "daemon/session/admission.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace kvrail::session {
namespace {

// Waits (up to 10 s) until `done` holds.
template <typename F>
bool Eventually(F done) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST_CASE("AdmitsInline: ids in the packet up to the bound; never a shared table") {
  v1::TransferSpec spec;
  CHECK(AdmitsInline(spec, 4));        // no ids (a bytes transfer)
  CHECK_FALSE(AdmitsInline(spec, 0));  // 0: never
  for (uint32_t id : {1, 2}) spec.mutable_src()->add_block_ids(id);
  spec.mutable_dst()->set_block_ids_le32(std::string(8, '\0'));  // 2 ids
  CHECK(AdmitsInline(spec, 4));
  CHECK_FALSE(AdmitsInline(spec, 3));
  v1::TransferSpec table;
  table.mutable_dst()->mutable_block_table()->set_count(1);
  CHECK_FALSE(AdmitsInline(table, 1 << 20));
}

TEST_CASE("each session's tasks run in order and one at a time; sessions run in parallel") {
  constexpr int kSessions = 6, kTasks = 300;
  absl::Mutex mu;
  std::vector<std::vector<int>> ran(kSessions);
  std::vector<std::unique_ptr<std::atomic<int>>> inside;
  for (int s = 0; s < kSessions; ++s) inside.push_back(std::make_unique<std::atomic<int>>(0));
  std::atomic<int> overlapped{0}, most_at_once{0}, now{0};
  {
    AdmissionPool pool(4, kTasks);
    for (int s = 0; s < kSessions; ++s) pool.Open(s + 1);
    for (int i = 0; i < kTasks; ++i) {
      for (int s = 0; s < kSessions; ++s) {
        REQUIRE(pool.Post(s + 1,
                          [&, s, i] {
                            if (inside[s]->fetch_add(1) != 0) overlapped.fetch_add(1);
                            const int at_once = now.fetch_add(1) + 1;
                            int seen = most_at_once.load();
                            while (at_once > seen &&
                                   !most_at_once.compare_exchange_weak(seen, at_once)) {
                            }
                            if (i % 50 == 0)
                              absl::SleepFor(absl::Milliseconds(2));  // let others in
                            {
                              absl::MutexLock lock(&mu);
                              ran[s].push_back(i);
                            }
                            now.fetch_sub(1);
                            inside[s]->fetch_sub(1);
                          })
                    .ok());
      }
    }
    REQUIRE(Eventually([&] { return pool.queued() == 0 && pool.running() == 0; }));
    for (int s = 0; s < kSessions; ++s) CHECK(pool.Idle(s + 1));
  }
  CHECK(overlapped.load() == 0);
  CHECK(most_at_once.load() > 1);  // different sessions ran at the same time
  for (int s = 0; s < kSessions; ++s) {
    absl::MutexLock lock(&mu);
    REQUIRE(ran[s].size() == kTasks);
    for (int i = 0; i < kTasks; ++i) CHECK(ran[s][i] == i);
  }
}

TEST_CASE("AwaitIdle returns once every queued task has run (none dropped)") {
  AdmissionPool pool(2, 64);
  pool.Open(1);
  pool.Open(2);
  absl::Notification release;
  std::atomic<int> ran{0};
  REQUIRE(pool.Post(1,
                    [&] {
                      release.WaitForNotification();
                      ran.fetch_add(1);
                    })
              .ok());
  for (int i = 0; i < 20; ++i) {
    REQUIRE(pool.Post(1 + i % 2,
                      [&] {
                        absl::SleepFor(absl::Microseconds(200));
                        ran.fetch_add(1);
                      })
                .ok());
  }
  std::atomic<bool> idle{false};
  std::thread waiter([&] {
    pool.AwaitIdle();
    idle.store(true);
  });
  absl::SleepFor(absl::Milliseconds(50));
  CHECK_FALSE(idle.load());  // the first task of session 1 still runs, and tasks wait behind it
  release.Notify();
  waiter.join();
  CHECK(ran.load() == 21);
  CHECK(pool.queued() == 0);
  CHECK(pool.running() == 0);
}

TEST_CASE("AwaitIdle also waits for a closed session's `then` (its session's end)") {
  AdmissionPool pool(1, 8);
  pool.Open(1);
  absl::Notification entered, release;
  REQUIRE(pool.Post(1,
                    [&] {
                      entered.Notify();
                      release.WaitForNotification();
                    })
              .ok());
  REQUIRE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::atomic<bool> awaited{false}, awaited_during_then{true};
  pool.Close(1, [&] {
    absl::SleepFor(absl::Milliseconds(50));  // AwaitIdle would return meanwhile if it could
    awaited_during_then.store(awaited.load());
  });
  std::thread waiter([&] {
    pool.AwaitIdle();
    awaited.store(true);
  });
  release.Notify();
  waiter.join();
  CHECK_FALSE(awaited_during_then.load());
  CHECK(pool.running() == 0);
}

TEST_CASE(
    "a session closed with tasks queued has none of them run; `then` follows the running one") {
  AdmissionPool pool(2, 16);
  pool.Open(7);
  pool.Open(8);
  absl::Notification entered, release;
  std::atomic<int> queued_ran{0}, other_ran{0};
  std::atomic<bool> first_done{false}, then_ran{false}, then_after_first{false};
  REQUIRE(pool.Post(7,
                    [&] {
                      entered.Notify();
                      release.WaitForNotification();
                      first_done.store(true);
                    })
              .ok());
  REQUIRE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (int i = 0; i < 5; ++i) REQUIRE(pool.Post(7, [&] { queued_ran.fetch_add(1); }).ok());
  CHECK_FALSE(pool.Idle(7));
  CHECK(pool.queued() == 5);
  // Another session is served meanwhile by the other worker.
  REQUIRE(pool.Post(8, [&] { other_ran.fetch_add(1); }).ok());
  REQUIRE(Eventually([&] { return other_ran.load() == 1; }));

  CHECK(pool.Close(7, [&] {
    then_after_first.store(first_done.load());
    then_ran.store(true);
  }) == 5);
  CHECK(pool.queued() == 0);
  CHECK_FALSE(then_ran.load());  // the first task still runs
  CHECK(absl::IsFailedPrecondition(pool.Post(7, [&] { queued_ran.fetch_add(1); })));
  release.Notify();
  REQUIRE(Eventually([&] { return then_ran.load(); }));
  CHECK(then_after_first.load());
  CHECK(queued_ran.load() == 0);

  // A session closed while idle: `then` at once, on the closing thread.
  bool at_once = false;
  CHECK(pool.Close(8, [&] { at_once = true; }) == 0);
  CHECK(at_once);
}

TEST_CASE("a session's full queue refuses the next task, naming the cap; others are not limited") {
  AdmissionPool pool(1, 2);
  pool.Open(1);
  pool.Open(2);
  absl::Notification entered, release;
  REQUIRE(pool.Post(1,
                    [&] {
                      entered.Notify();
                      release.WaitForNotification();
                    })
              .ok());
  REQUIRE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::atomic<int> ran{0};
  REQUIRE(pool.Post(1, [&] { ran.fetch_add(1); }).ok());
  REQUIRE(pool.Post(1, [&] { ran.fetch_add(1); }).ok());
  const absl::Status full = pool.Post(1, [&] { ran.fetch_add(100); });
  CHECK(absl::IsResourceExhausted(full));
  CHECK(full.message().rfind("admission queue: this session has 2 packets queued", 0) == 0);
  CHECK(pool.Post(2, [&] { ran.fetch_add(10); }).ok());
  CHECK(pool.Post(2, [&] { ran.fetch_add(10); }).ok());
  release.Notify();
  REQUIRE(Eventually([&] { return ran.load() == 22; }));
}

TEST_CASE("destroying the pool lets the running task finish and drops the queued ones") {
  absl::Notification entered, release;
  std::atomic<int> ran{0};
  std::atomic<bool> finished{false};
  std::thread releaser;
  {
    AdmissionPool pool(1, 8);
    pool.Open(3);
    REQUIRE(pool.Post(3,
                      [&] {
                        entered.Notify();
                        release.WaitForNotification();
                        finished.store(true);
                      })
                .ok());
    REQUIRE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
    for (int i = 0; i < 3; ++i) REQUIRE(pool.Post(3, [&] { ran.fetch_add(1); }).ok());
    releaser = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(20));
      release.Notify();
    });
  }
  releaser.join();
  CHECK(finished.load());
  CHECK(ran.load() == 0);
}

}  // namespace
}  // namespace kvrail::session
