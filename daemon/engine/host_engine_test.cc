// The host engine's per-class byte limit, observed from a job's own tile callbacks.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/host_engine.h"

namespace kvrail::engine {
namespace {

planner::Plan BytesPlan(uint64_t bytes, uint64_t tile) {
  v1::TransferSpec spec;
  spec.set_num_bytes(bytes);
  planner::RegionView view{bytes, true, false, {}};
  planner::PlanOptions options;
  options.tile_bytes = tile;
  auto plan = planner::MakePlan(spec, view, view, options);
  if (!plan.ok()) std::abort();
  return *std::move(plan);
}

// Copies `bytes` between two buffers in `tile`-sized tiles and records how many of its tiles
// were being copied at once (OnTileStart .. OnTileDone).
class CountingJob final : public Job {
 public:
  CountingJob(PriorityClass priority, uint64_t bytes, uint64_t tile)
      : priority_(priority), src_(bytes), dst_(bytes, 0), plan_(BytesPlan(bytes, tile)) {
    for (size_t i = 0; i < bytes; ++i) src_[i] = static_cast<uint8_t>(i * 7 + 1);
  }
  const planner::Plan& plan() const override { return plan_; }
  const uint8_t* src_base() const override { return src_.data(); }
  uint8_t* dst_base() const override { return const_cast<uint8_t*>(dst_.data()); }
  PriorityClass priority() const override { return priority_; }
  void OnTileStart(uint32_t) override {
    const int now = ++running_;
    int seen = max_running_.load();
    while (now > seen && !max_running_.compare_exchange_weak(seen, now)) {
    }
    // The first tile of a job that expects company waits (up to 5 s) for a second one to start,
    // so "more than one ran at once" does not depend on how the threads happen to be scheduled.
    if (expect_company_ && !waited_.exchange(true)) {
      const absl::Time until = absl::Now() + absl::Seconds(5);
      while (max_running_.load() < 2 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
    }
  }
  void ExpectCompany() { expect_company_ = true; }
  void OnTileDone(uint32_t, const absl::Status& status) override {
    --running_;
    absl::MutexLock lock(&mu_);
    ++done_;
    ok_ = ok_ && status.ok();
  }
  void WaitAll() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &CountingJob::AllDoneLocked));
  }
  std::vector<uint32_t> AllTiles() const {
    std::vector<uint32_t> t(plan_.num_tiles());
    for (uint32_t i = 0; i < t.size(); ++i) t[i] = i;
    return t;
  }
  int max_running() const { return max_running_.load(); }
  bool copied() const { return src_ == dst_; }
  bool ok() {
    absl::MutexLock lock(&mu_);
    return ok_;
  }

 private:
  // A member rather than a lambda: the thread-safety analysis sees Await's condition holds mu_.
  bool AllDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_ == plan_.num_tiles();
  }

  const PriorityClass priority_;
  std::vector<uint8_t> src_, dst_;
  planner::Plan plan_;
  std::atomic<int> running_{0}, max_running_{0};
  bool expect_company_ = false;  // set before the job is enqueued
  std::atomic<bool> waited_{false};
  absl::Mutex mu_;
  uint32_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool ok_ ABSL_GUARDED_BY(mu_) = true;
};

TEST_CASE("background max_inflight_bytes of one tile: one background tile at a time, all copied") {
  PriorityLimits limits;
  limits[static_cast<int>(PriorityClass::kBackground)].max_inflight_bytes = 256 << 10;
  auto engine = CreateHostEngine(4, limits);
  auto job = std::make_shared<CountingJob>(PriorityClass::kBackground, 32 << 20, 256 << 10);
  engine->Enqueue(job, job->AllTiles());
  job->WaitAll();
  CHECK(job->ok());
  CHECK(job->copied());
  CHECK(job->max_running() == 1);
}

TEST_CASE("a limit on one class leaves the others alone") {
  PriorityLimits limits;
  limits[static_cast<int>(PriorityClass::kBackground)].max_inflight_bytes = 256 << 10;
  auto engine = CreateHostEngine(4, limits);
  auto bg = std::make_shared<CountingJob>(PriorityClass::kBackground, 16 << 20, 256 << 10);
  auto normal = std::make_shared<CountingJob>(PriorityClass::kNormal, 64 << 20, 256 << 10);
  normal->ExpectCompany();
  engine->Enqueue(bg, bg->AllTiles());
  engine->Enqueue(normal, normal->AllTiles());
  bg->WaitAll();
  normal->WaitAll();
  CHECK(bg->copied());
  CHECK(normal->copied());
  CHECK(bg->max_running() == 1);
  // Normal tiles are not limited: with four workers a second normal tile starts while the first
  // waits for it (a limited class would leave the first waiting 5 s, alone).
  CHECK(normal->max_running() > 1);
}

}  // namespace
}  // namespace kvrail::engine
