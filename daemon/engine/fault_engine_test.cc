// The fault-injecting decorator around the host engine: injected failures report once with the
// injected status and move no byte; held and delayed tiles let a Remove (a cancel, a deadline)
// win; the Engine contract (each tile reported once or removed) holds.
#include "daemon/engine/fault_engine.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/manual_clock.h"
#include "daemon/engine/host_engine.h"

namespace kvrail::engine {
namespace {

constexpr uint8_t kPoison = 0xAB;
constexpr uint64_t kTile = 1024;
constexpr uint64_t kOffset = 512;  // the transfer writes [kOffset, kOffset + bytes) of dst

// Copies `bytes` from a patterned buffer into the middle of a poisoned one and records each
// tile's reports.
class RecordingJob final : public Job {
 public:
  explicit RecordingJob(uint64_t bytes)
      : src_(bytes), dst_(bytes + 2 * kOffset, kPoison), plan_(MakeBytesPlan(bytes)) {
    for (size_t i = 0; i < bytes; ++i) src_[i] = static_cast<uint8_t>(i * 7 + 1);
    done_.assign(plan_.num_tiles(), 0);
    status_.assign(plan_.num_tiles(), absl::OkStatus());
  }
  const planner::Plan& plan() const override { return plan_; }
  const uint8_t* src_base() const override { return src_.data(); }
  uint8_t* dst_base() const override { return const_cast<uint8_t*>(dst_.data()); }
  PriorityClass priority() const override { return PriorityClass::kNormal; }
  void OnTileStart(uint32_t) override {}
  void OnTileDone(uint32_t tile, const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    ++done_[tile];
    status_[tile] = status;
    ++reports_;
  }
  // Waits (up to 10 s) until `n` reports came.
  bool AwaitReports(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reports_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  size_t reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }
  int done(uint32_t tile) {
    absl::MutexLock lock(&mu_);
    return done_[tile];
  }
  absl::Status status(uint32_t tile) {
    absl::MutexLock lock(&mu_);
    return status_[tile];
  }
  // Whether dst byte `i` (of the whole buffer) holds the source byte or poison.
  bool Landed(uint64_t i) const {
    return i >= kOffset && i < kOffset + src_.size() && dst_[i] == src_[i - kOffset];
  }
  bool Poisoned(uint64_t i) const { return dst_[i] == kPoison; }
  size_t dst_size() const { return dst_.size(); }

 private:
  static planner::Plan MakeBytesPlan(uint64_t bytes) {
    v1::TransferSpec spec;
    spec.set_num_bytes(bytes);
    spec.mutable_dst()->set_byte_offset(kOffset);
    planner::RegionView src{bytes, false, false, {}};
    planner::RegionView dst{bytes + 2 * kOffset, true, false, {}};
    planner::PlanOptions options;
    options.tile_bytes = kTile;
    auto plan = planner::MakePlan(spec, src, dst, options);
    if (!plan.ok()) std::abort();
    return *std::move(plan);
  }

  std::vector<uint8_t> src_;
  std::vector<uint8_t> dst_;
  planner::Plan plan_;
  absl::Mutex mu_;
  std::vector<int> done_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> status_ ABSL_GUARDED_BY(mu_);
  size_t reports_ ABSL_GUARDED_BY(mu_) = 0;
};

std::vector<uint32_t> AllTiles(const Job& job) {
  std::vector<uint32_t> tiles(job.plan().num_tiles());
  for (uint32_t t = 0; t < tiles.size(); ++t) tiles[t] = t;
  return tiles;
}

TEST_CASE("an injected failure reports once with its status and moves no byte") {
  auto host = CreateHostEngine(2);
  const absl::Status injected = absl::DataLossError("injected: NIC reset");
  auto faulty = FaultInjectingEngine::Create(host.get(), FailTiles(0, {2}, injected));
  auto job = std::make_shared<RecordingJob>(4 * kTile);
  faulty->Enqueue(job, AllTiles(*job));
  REQUIRE(job->AwaitReports(4));
  for (uint32_t t = 0; t < 4; ++t) CHECK(job->done(t) == 1);
  CHECK(job->status(2) == injected);
  CHECK(job->status(0).ok());
  CHECK(faulty->failed() == 1);
  for (uint64_t i = 0; i < job->dst_size(); ++i) {
    const bool in_failed_tile = i >= kOffset + 2 * kTile && i < kOffset + 3 * kTile;
    const bool in_transfer = i >= kOffset && i < kOffset + 4 * kTile;
    INFO("byte " << i);
    if (in_transfer && !in_failed_tile) {
      REQUIRE(job->Landed(i));
    } else {
      REQUIRE(job->Poisoned(i));  // outside the destination range, or the failed tile
    }
  }
  CHECK(job->reports() == 4);
}

TEST_CASE("every nth tile fails; each tile still reports exactly once") {
  auto host = CreateHostEngine(3);
  auto faulty = FaultInjectingEngine::Create(host.get(), FailEveryNth(3, absl::InternalError("x")));
  auto job = std::make_shared<RecordingJob>(9 * kTile);
  faulty->Enqueue(job, AllTiles(*job));
  REQUIRE(job->AwaitReports(9));
  int failed = 0;
  for (uint32_t t = 0; t < 9; ++t) {
    CHECK(job->done(t) == 1);
    failed += job->status(t).ok() ? 0 : 1;
  }
  CHECK(failed == 3);
  CHECK(!job->status(2).ok());
  CHECK(!job->status(8).ok());
}

TEST_CASE("held tiles are removed by Remove and never report; released ones run") {
  auto host = CreateHostEngine(2);
  auto faulty = FaultInjectingEngine::Create(host.get(), [](const TileRef& t) {
    return t.job_ordinal == 0 ? Fault::Hold() : Fault::None();
  });
  auto cancelled = std::make_shared<RecordingJob>(4 * kTile);
  auto released = std::make_shared<RecordingJob>(2 * kTile);
  faulty->Enqueue(cancelled, AllTiles(*cancelled));
  CHECK(faulty->held() == 4);
  CHECK(faulty->QueuedTiles()[static_cast<int>(PriorityClass::kNormal)] == 4);
  // The cancel wins over the held tiles: all four are removed and none will report.
  CHECK(faulty->Remove(cancelled.get()) == 4);
  CHECK(faulty->held() == 0);
  faulty->Enqueue(released, AllTiles(*released));  // job 1: not held
  REQUIRE(released->AwaitReports(2));
  faulty->ReleaseHeld();  // nothing of the cancelled job is left to release
  CHECK(cancelled->reports() == 0);
  for (uint64_t i = 0; i < cancelled->dst_size(); ++i) REQUIRE(cancelled->Poisoned(i));
}

TEST_CASE("a delayed tile waits for the decorator's clock, then runs") {
  auto host = CreateHostEngine(1);
  ManualClock clock;
  auto faulty = FaultInjectingEngine::Create(
      host.get(), [](const TileRef&) { return Fault::Delay(absl::Seconds(5)); }, &clock);
  auto job = std::make_shared<RecordingJob>(2 * kTile);
  faulty->Enqueue(job, AllTiles(*job));
  CHECK(faulty->held() == 2);
  CHECK(job->reports() == 0);
  clock.Advance(absl::Seconds(6));
  REQUIRE(job->AwaitReports(2));
  CHECK(job->status(0).ok());
  CHECK(job->status(1).ok());
  CHECK(faulty->held() == 0);
  CHECK(job->Landed(kOffset));
}

}  // namespace
}  // namespace kvrail::engine
