// AdmissionPool: each session's tasks run in the order posted and one at a time, sessions in
// parallel; a session closed with tasks queued has none of them run, and its `then` runs only
// after the task that was running; a full queue refuses, naming the cap; a bulk task runs on a
// bulk worker (SCHED_IDLE) and an ordinary one never does, a session's order kept across both;
// the guard lifts a bulk task that outlives its deadline.
#include "daemon/session/admission.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
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

// Where a task ran: its thread and that thread's scheduling policy.
struct RanOn {
  std::thread::id thread;
  int policy = -1;
};

RanOn Here() { return {std::this_thread::get_id(), ::sched_getscheduler(0)}; }

TEST_CASE("SubmitIdsBound: a table's count, le32 bytes / 4, packed ids' bytes; both sides") {
  auto bound = [](const v1::TransferSpec& spec) {
    v1::SubmitTransferRequest request;
    *request.mutable_spec() = spec;
    return SubmitIdsBound(request.SerializeAsString());
  };
  v1::TransferSpec spec;
  CHECK(bound(spec) == 0);
  spec.mutable_src()->mutable_block_table()->set_count(1 << 22);
  spec.mutable_src()->mutable_block_table()->set_region_id(9);
  CHECK(bound(spec) == (1 << 22));
  spec.mutable_dst()->set_block_ids_le32(std::string(4 * 1000, '\x01'));
  CHECK(bound(spec) == (1 << 22) + 1000);
  v1::TransferSpec packed;
  for (uint32_t id : {1u, 2u, 300u}) packed.mutable_dst()->add_block_ids(id);  // 1 + 1 + 2 bytes
  packed.set_num_layers(7);
  CHECK(bound(packed) == 4);  // at least the 3 ids, at most one per byte
  // Garbage or a truncated request: what was counted before it (the worker reports the error).
  CHECK(SubmitIdsBound("\xff\xff\xff") == 0);
  v1::SubmitTransferRequest request;
  *request.mutable_spec() = spec;
  const std::string bytes = request.SerializeAsString();
  CHECK(SubmitIdsBound(absl::string_view(bytes).substr(0, bytes.size() - 1)) == 0);
}

TEST_CASE("PostIdsBound: packed ids' bytes, le32 bytes / 4, both sides") {
  v1::PostTransferRequest post;
  post.set_prepared_id(77);
  CHECK(PostIdsBound(post.SerializeAsString()) == 0);
  for (uint32_t id : {5u, 200u}) post.add_src_block_ids(id);  // 1 + 2 bytes
  post.set_dst_block_ids_le32(std::string(4 * 70000, '\0'));
  CHECK(PostIdsBound(post.SerializeAsString()) == 3 + 70000);
}

TEST_CASE("ClassOfIds: bulk above kBulkIds") {
  CHECK(ClassOfIds(0) == TaskClass::kOrdinary);
  CHECK(ClassOfIds(kBulkIds) == TaskClass::kOrdinary);
  CHECK(ClassOfIds(kBulkIds + 1) == TaskClass::kBulk);
}

TEST_CASE("a bulk task runs on a bulk worker (SCHED_IDLE), an ordinary task never does") {
  const int base = ::sched_getscheduler(0);  // what the pool's threads inherit
  REQUIRE(base != AdmissionPool::kBulkPolicy);
  constexpr int kTasks = 40;
  absl::Mutex mu;
  std::vector<RanOn> bulk, ordinary;
  {
    AdmissionPool pool(2, 64, 1);
    for (uint64_t s = 1; s <= 4; ++s) pool.Open(s);
    for (int i = 0; i < kTasks; ++i) {
      const uint64_t session = 1 + i % 4;
      const TaskClass task_class = i % 3 == 0 ? TaskClass::kBulk : TaskClass::kOrdinary;
      auto& into = task_class == TaskClass::kBulk ? bulk : ordinary;
      REQUIRE(pool.Post(
                      session,
                      [&mu, &into] {
                        const RanOn here = Here();
                        absl::MutexLock lock(&mu);
                        into.push_back(here);
                      },
                      task_class)
                  .ok());
    }
    pool.AwaitIdle();
  }
  REQUIRE(bulk.size() == 14);
  REQUIRE(ordinary.size() == 26);
  for (const RanOn& on : bulk) CHECK(on.policy == AdmissionPool::kBulkPolicy);
  for (const RanOn& on : ordinary) CHECK(on.policy == base);
  for (const RanOn& on : ordinary) {
    CHECK(std::none_of(bulk.begin(), bulk.end(),
                       [&](const RanOn& b) { return b.thread == on.thread; }));
  }
  // One bulk worker: every bulk task on the same thread.
  for (const RanOn& on : bulk) CHECK(on.thread == bulk.front().thread);
}

TEST_CASE("PlanBulkWorkers: guarded workers only where a thread can leave SCHED_IDLE") {
  const absl::Duration guarded = absl::Milliseconds(100);
  CHECK(PlanBulkWorkers(1, guarded, true).workers == 1);
  CHECK(PlanBulkWorkers(1, guarded, true).why.empty());
  CHECK(PlanBulkWorkers(3, absl::ZeroDuration(), false).workers == 3);  // unguarded: as asked
  CHECK(PlanBulkWorkers(0, guarded, false).workers == 0);
  CHECK(PlanBulkWorkers(0, guarded, false).why.empty());  // none asked for: nothing to say
  const BulkPlan refused = PlanBulkWorkers(2, guarded, false);
  CHECK(refused.workers == 0);
  CHECK(refused.why.find("session_admission_bulk_workers: 2 not started") == 0);
  CHECK(refused.why.find("session_admission_bulk_deadline_ms: 100") != std::string::npos);
  CHECK(refused.why.find("LimitNICE") != std::string::npos);
}

// Pins the calling thread to `cpu`; false where the machine does not let it.
bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set) == 0;
}

double ThreadCpuMs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Where a bulk task met a CPU an ordinary thread keeps busy: SCHED_IDLE gets ~0.3% of it, so
// 100 ms of work would take ~30 s; the guard lifts the task at its deadline and it finishes in
// well under a second. The worker is back in SCHED_IDLE for its next task.
TEST_CASE("the guard lifts a bulk task past its deadline beside a busy CPU; the next starts idle") {
  if (!CanLeaveBackground()) {
    WARN("SKIPPED: this process may not leave SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE < 20)");
    return;
  }
  const int cpu = ::sched_getcpu();
  REQUIRE(cpu >= 0);
  std::atomic<bool> stop{false}, hog_started{false}, hog_pinned{false};
  std::thread hog([&] {  // a busy tenant's thread, runnable all the time on that CPU
    hog_pinned = PinTo(cpu);
    hog_started = true;
    while (hog_pinned && !stop.load(std::memory_order_relaxed)) {
    }
  });
  while (!hog_started.load()) std::this_thread::yield();
  if (!hog_pinned) {
    hog.join();
    FAIL("could not pin a thread to CPU " << cpu);
  }
  std::atomic<bool> give_up{false}, done{false};
  int policy_at_end = -1, policy_next = -1;
  double wall_ms = 0;
  {
    AdmissionPool pool(1, 8, 1, absl::Milliseconds(20));
    pool.Open(1);
    REQUIRE(pool.Post(
                    1,
                    [&] {
                      cpu_set_t was;
                      ::pthread_getaffinity_np(::pthread_self(), sizeof(was), &was);
                      const absl::Time start = absl::Now();
                      if (PinTo(cpu)) {
                        const double from = ThreadCpuMs();
                        while (ThreadCpuMs() - from < 100 && !give_up.load()) {
                        }
                      }
                      wall_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
                      policy_at_end = ::sched_getscheduler(0);
                      ::pthread_setaffinity_np(::pthread_self(), sizeof(was), &was);
                      done = true;
                    },
                    TaskClass::kBulk)
                .ok());
    const bool finished = Eventually([&] { return done.load(); });
    give_up = true;
    CHECK(finished);
    REQUIRE(pool.Post(
                    1, [&] { policy_next = ::sched_getscheduler(0); }, TaskClass::kBulk)
                .ok());
    pool.AwaitIdle();
    CHECK(pool.promoted() == 1);
  }
  stop = true;
  hog.join();
  INFO("the bulk task took " << wall_ms << " ms of wall time for 100 ms of CPU");
  CHECK(policy_at_end == SCHED_OTHER);
  CHECK(policy_next == AdmissionPool::kBulkPolicy);
  CHECK(wall_ms < 5000);
}

TEST_CASE("a bulk task within its deadline stays in the background; no guard without one") {
  for (const absl::Duration deadline : {absl::Seconds(30), absl::ZeroDuration()}) {
    AdmissionPool pool(1, 8, 1, deadline);
    pool.Open(1);
    int policy = -1;
    REQUIRE(pool.Post(
                    1,
                    [&] {
                      absl::SleepFor(absl::Milliseconds(30));
                      policy = ::sched_getscheduler(0);
                    },
                    TaskClass::kBulk)
                .ok());
    pool.AwaitIdle();
    CHECK(policy == AdmissionPool::kBulkPolicy);
    CHECK(pool.promoted() == 0);
  }
}

TEST_CASE("without bulk workers a bulk task runs on an ordinary worker") {
  const int base = ::sched_getscheduler(0);
  AdmissionPool pool(1, 8);
  pool.Open(1);
  RanOn on;
  REQUIRE(pool.Post(
                  1, [&] { on = Here(); }, TaskClass::kBulk)
              .ok());
  pool.AwaitIdle();
  CHECK(on.policy == base);
  CHECK(on.thread != std::thread::id());
}

TEST_CASE("a session's order holds across classes; a bulk head holds only its own session") {
  AdmissionPool pool(2, 64, 1);
  pool.Open(1);  // holds the bulk worker
  pool.Open(2);  // mixed classes, its bulk task waits for the bulk worker
  pool.Open(3);  // ordinary only
  absl::Notification entered, release;
  REQUIRE(pool.Post(
                  1,
                  [&] {
                    entered.Notify();
                    release.WaitForNotification();
                  },
                  TaskClass::kBulk)
              .ok());
  REQUIRE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::Mutex mu;
  std::vector<int> order;
  std::atomic<int> inside{0}, overlapped{0};
  auto step = [&](int i) {
    return [&, i] {
      if (inside.fetch_add(1) != 0) overlapped.fetch_add(1);
      {
        absl::MutexLock lock(&mu);
        order.push_back(i);
      }
      inside.fetch_sub(1);
    };
  };
  // Session 2: ordinary, bulk, ordinary, ordinary, bulk, ordinary.
  const TaskClass classes[] = {TaskClass::kOrdinary, TaskClass::kBulk, TaskClass::kOrdinary,
                               TaskClass::kOrdinary, TaskClass::kBulk, TaskClass::kOrdinary};
  for (int i = 0; i < 6; ++i) REQUIRE(pool.Post(2, step(i), classes[i]).ok());
  std::atomic<int> third{0};
  for (int i = 0; i < 5; ++i) REQUIRE(pool.Post(3, [&] { third.fetch_add(1); }).ok());
  // Session 3 is served by the ordinary workers, session 2 up to its bulk task only.
  REQUIRE(Eventually([&] { return third.load() == 5; }));
  REQUIRE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return order.size() == 1;
  }));
  absl::SleepFor(absl::Milliseconds(20));  // an ordinary worker that skipped the bulk head
  {
    absl::MutexLock lock(&mu);
    CHECK(order == std::vector<int>{0});
  }
  CHECK(pool.queued() == 5);
  CHECK_FALSE(pool.Idle(2));
  release.Notify();
  pool.AwaitIdle();
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(overlapped.load() == 0);
  CHECK(pool.Idle(2));
}

TEST_CASE("bulk tasks: Close drops the queued ones, `then` follows the running one; AwaitIdle") {
  AdmissionPool pool(1, 8, 1);
  pool.Open(5);
  absl::Notification entered, release;
  std::atomic<bool> first_done{false}, then_after_first{false}, then_ran{false};
  std::atomic<int> queued_ran{0};
  REQUIRE(pool.Post(
                  5,
                  [&] {
                    entered.Notify();
                    release.WaitForNotification();
                    first_done.store(true);
                  },
                  TaskClass::kBulk)
              .ok());
  REQUIRE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  REQUIRE(pool.Post(
                  5, [&] { queued_ran.fetch_add(1); }, TaskClass::kBulk)
              .ok());
  REQUIRE(pool.Post(5, [&] { queued_ran.fetch_add(1); }).ok());
  CHECK(pool.Close(5, [&] {
    then_after_first.store(first_done.load());
    then_ran.store(true);
  }) == 2);
  std::atomic<bool> idle{false};
  std::thread waiter([&] {
    pool.AwaitIdle();
    idle.store(true);
  });
  absl::SleepFor(absl::Milliseconds(20));
  CHECK_FALSE(idle.load());  // the bulk task still runs
  release.Notify();
  waiter.join();
  CHECK(then_ran.load());
  CHECK(then_after_first.load());
  CHECK(queued_ran.load() == 0);
  CHECK(pool.running() == 0);
  // A bulk task of a session reopened afterwards still runs.
  pool.Open(5);
  std::atomic<bool> again{false};
  REQUIRE(pool.Post(
                  5, [&] { again.store(true); }, TaskClass::kBulk)
              .ok());
  pool.AwaitIdle();
  CHECK(again.load());
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
