// The host engine's small jobs on the admitting thread (EnqueueAdmitted): which thread reports
// a job's tiles, and that the inline path keeps the workers' order and limits.
#include <catch2/catch.hpp>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/host_engine.h"
#include "daemon/planner/testing/plan_fixtures.h"

namespace kvrail::engine {
namespace {

using planner::testing::BytesPlan;

// Copies `bytes` in tiles of `tile`, recording the thread that reported each tile; with a gate,
// its first tile's start waits for Open() (to keep a worker busy).
class ThreadJob final : public Job {
 public:
  ThreadJob(PriorityClass priority, uint64_t bytes, uint64_t tile, bool gated = false)
      : priority_(priority),
        src_(bytes),
        dst_(bytes, 0),
        plan_(BytesPlan(bytes, tile)),
        gated_(gated) {
    for (size_t i = 0; i < bytes; ++i) src_[i] = static_cast<uint8_t>(i * 13 + 5);
  }
  const planner::Plan& plan() const override { return plan_; }
  const uint8_t* src_base() const override { return src_.data(); }
  uint8_t* dst_base() const override { return const_cast<uint8_t*>(dst_.data()); }
  PriorityClass priority() const override { return priority_; }
  void OnTileStart(uint32_t) override {
    if (gated_ && !started_.HasBeenNotified()) {
      started_.Notify();
      open_.WaitForNotification();
    }
  }
  void OnTileDone(uint32_t, const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    threads_.push_back(std::this_thread::get_id());
    ok_ = ok_ && status.ok();
  }
  std::vector<uint32_t> AllTiles() const {
    std::vector<uint32_t> t(plan_.num_tiles());
    for (uint32_t i = 0; i < t.size(); ++i) t[i] = i;
    return t;
  }
  void WaitStarted() { started_.WaitForNotification(); }
  void Open() { open_.Notify(); }
  void WaitAll() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &ThreadJob::AllDoneLocked));
  }
  size_t reported() {
    absl::MutexLock lock(&mu_);
    return threads_.size();
  }
  // Whether every tile was reported, each on `thread`.
  bool AllOn(std::thread::id thread) {
    absl::MutexLock lock(&mu_);
    if (threads_.size() != plan_.num_tiles()) return false;
    for (const std::thread::id t : threads_) {
      if (t != thread) return false;
    }
    return true;
  }
  bool copied() {
    absl::MutexLock lock(&mu_);
    return ok_ && src_ == dst_;
  }

 private:
  bool AllDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return threads_.size() == plan_.num_tiles();
  }
  const PriorityClass priority_;
  std::vector<uint8_t> src_, dst_;
  planner::Plan plan_;
  const bool gated_;
  absl::Notification started_, open_;
  absl::Mutex mu_;
  std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
  bool ok_ ABSL_GUARDED_BY(mu_) = true;
};

constexpr uint64_t kInline = 64 << 10;

TEST_CASE("a small admitted job is copied and reported on the admitting thread") {
  auto engine = CreateHostEngine(2, {}, kInline);
  const std::thread::id me = std::this_thread::get_id();
  auto small = std::make_shared<ThreadJob>(PriorityClass::kNormal, 4 << 10, 1 << 20);
  engine->EnqueueAdmitted(small, small->AllTiles());
  // Reported before EnqueueAdmitted returned, on this thread.
  CHECK(small->AllOn(me));
  CHECK(small->copied());
  // Several tiles within the limit: all of them here, in order.
  auto tiled = std::make_shared<ThreadJob>(PriorityClass::kCritical, 64 << 10, 16 << 10);
  REQUIRE(tiled->plan().num_tiles() == 4);
  engine->EnqueueAdmitted(tiled, tiled->AllTiles());
  CHECK(tiled->AllOn(me));
  CHECK(tiled->copied());
}

TEST_CASE("a job above the inline limit, a plain Enqueue, or a limit of 0 goes to a worker") {
  const std::thread::id me = std::this_thread::get_id();
  auto engine = CreateHostEngine(2, {}, kInline);
  auto large = std::make_shared<ThreadJob>(PriorityClass::kNormal, kInline + 4096, 1 << 20);
  engine->EnqueueAdmitted(large, large->AllTiles());
  large->WaitAll();
  CHECK_FALSE(large->AllOn(me));
  CHECK(large->copied());
  auto plain = std::make_shared<ThreadJob>(PriorityClass::kNormal, 4 << 10, 1 << 20);
  engine->Enqueue(plain, plain->AllTiles());
  plain->WaitAll();
  CHECK_FALSE(plain->AllOn(me));
  auto off = CreateHostEngine(2, {}, 0);
  auto small = std::make_shared<ThreadJob>(PriorityClass::kNormal, 4 << 10, 1 << 20);
  off->EnqueueAdmitted(small, small->AllTiles());
  small->WaitAll();
  CHECK_FALSE(small->AllOn(me));
  CHECK(small->copied());
}

TEST_CASE("a small job queues behind work of a higher class waiting for a worker") {
  const std::thread::id me = std::this_thread::get_id();
  // One worker, held by a critical job's first tile; its second tile waits in the queue.
  auto engine = CreateHostEngine(1, {}, kInline);
  auto holder = std::make_shared<ThreadJob>(PriorityClass::kCritical, 8 << 10, 4 << 10, true);
  engine->Enqueue(holder, holder->AllTiles());
  holder->WaitStarted();
  // A normal job would jump the queued critical tile: it is queued, not run here.
  auto normal = std::make_shared<ThreadJob>(PriorityClass::kNormal, 4 << 10, 1 << 20);
  engine->EnqueueAdmitted(normal, normal->AllTiles());
  CHECK(normal->reported() == 0);
  // So is a critical one: its class has no free slot (the one worker runs a critical tile).
  auto critical = std::make_shared<ThreadJob>(PriorityClass::kCritical, 4 << 10, 1 << 20);
  engine->EnqueueAdmitted(critical, critical->AllTiles());
  CHECK(critical->reported() == 0);
  holder->Open();
  holder->WaitAll();
  normal->WaitAll();
  critical->WaitAll();
  CHECK_FALSE(normal->AllOn(me));
  CHECK_FALSE(critical->AllOn(me));
  CHECK(normal->copied());
  CHECK(critical->copied());
  CHECK(holder->copied());
}

TEST_CASE("a class's max_inflight_bytes holds for inline jobs") {
  PriorityLimits limits;
  limits[static_cast<int>(PriorityClass::kBackground)].max_inflight_bytes = 4 << 10;
  auto engine = CreateHostEngine(3, limits, kInline);  // two background slots
  const std::thread::id me = std::this_thread::get_id();
  // A background tile in flight on a worker: a slot is free, yet the next background job would
  // pass the byte limit.
  auto holder = std::make_shared<ThreadJob>(PriorityClass::kBackground, 4 << 10, 4 << 10, true);
  engine->Enqueue(holder, holder->AllTiles());
  holder->WaitStarted();
  auto next = std::make_shared<ThreadJob>(PriorityClass::kBackground, 4 << 10, 1 << 20);
  engine->EnqueueAdmitted(next, next->AllTiles());
  CHECK(next->reported() == 0);
  // Another class is not held back.
  auto normal = std::make_shared<ThreadJob>(PriorityClass::kNormal, 4 << 10, 1 << 20);
  engine->EnqueueAdmitted(normal, normal->AllTiles());
  CHECK(normal->AllOn(me));
  holder->Open();
  next->WaitAll();
  CHECK(next->copied());
}

}  // namespace
}  // namespace kvrail::engine
