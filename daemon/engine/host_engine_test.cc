// The host engine's per-class byte limit, observed from a job's own tile callbacks.
#include "daemon/engine/host_engine.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/engine/engine.h"
#include "daemon/planner/testing/plan_fixtures.h"
#include "daemon/planner/testing/random_case.h"

namespace kvrail::engine {
namespace {

using planner::testing::BytesPlan;

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

// A paged transfer (random layouts on each side: NHD <-> HND, block sizes, head ranges) with
// TransferSpec.digest, recording what the engine reports per tile.
class DigestJob final : public Job {
 public:
  DigestJob(const planner::testing::RandomCase& c, bool digest, std::mt19937_64& rng)
      : src_(c.src.size_bytes),
        dst_(c.dst.size_bytes, 0xAB),
        want_(c.dst.size_bytes, 0xAB),
        plan_(*planner::MakePlan(c.spec, c.src, c.dst, c.options)),
        digest_(digest) {
    for (auto& b : src_) b = static_cast<uint8_t>(rng());
    planner::testing::ReferenceCopy(c, src_.data(), want_.data());
  }
  const planner::Plan& plan() const override { return plan_; }
  const uint8_t* src_base() const override { return src_.data(); }
  uint8_t* dst_base() const override { return const_cast<uint8_t*>(dst_.data()); }
  PriorityClass priority() const override { return PriorityClass::kNormal; }
  bool wants_digest() const override { return digest_; }
  void OnTileStart(uint32_t) override {}
  void OnTileDigest(uint32_t tile, uint64_t source, uint64_t destination) override {
    absl::MutexLock lock(&mu_);
    digests_[tile] = {source, destination};
  }
  void OnTileDone(uint32_t tile, const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    ++done_;
    if (!status.ok()) errors_[tile] = status;
  }
  // Enqueues every tile of `job` (owned: the engine may touch a job after its last report)
  // and waits for their reports.
  static void Run(Engine& engine, const std::shared_ptr<DigestJob>& job) {
    std::vector<uint32_t> tiles(job->plan_.num_tiles());
    for (uint32_t i = 0; i < tiles.size(); ++i) tiles[i] = i;
    engine.Enqueue(job, tiles);
    absl::MutexLock lock(&job->mu_);
    job->mu_.Await(absl::Condition(job.get(), &DigestJob::AllDoneLocked));
  }
  bool copied() const { return dst_ == want_; }
  std::vector<uint8_t>& dst() { return dst_; }
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> digests() {
    absl::MutexLock lock(&mu_);
    return digests_;
  }
  std::map<uint32_t, absl::Status> errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }

 private:
  bool AllDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_ == plan_.num_tiles();
  }
  std::vector<uint8_t> src_, dst_, want_;
  planner::Plan plan_;
  const bool digest_;
  absl::Mutex mu_;
  uint32_t done_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> digests_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, absl::Status> errors_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE("digest: every tile hashed on both sides, equal, and equal to the host reference") {
  std::mt19937_64 rng(1701);
  auto engine = CreateHostEngine(3);
  for (int n = 0; n < 60; ++n) {
    const planner::testing::RandomCase c =
        n % 2 ? planner::testing::RandomPagedCase(rng) : planner::testing::RandomServingCase(rng);
    INFO(c.ToString());
    auto job = std::make_shared<DigestJob>(c, /*digest=*/true, rng);
    DigestJob::Run(*engine, job);
    REQUIRE(job->errors().empty());
    REQUIRE(job->copied());
    const auto digests = job->digests();
    REQUIRE(digests.size() == job->plan().num_tiles());
    for (const auto& [tile, d] : digests) {
      REQUIRE(d.first == d.second);
      // Independently of the engine: the source tile read in place.
      REQUIRE(d.first == planner::TileDigestHost(job->plan(), tile, job->src_base(),
                                                 planner::DigestSide::kSource));
    }
  }
}

TEST_CASE("digest: a destination byte corrupted after the copy fails its tile with DATA_LOSS") {
  std::mt19937_64 rng(99);
  planner::testing::RandomCase c = planner::testing::RandomServingCase(rng);
  c.options.tile_bytes = 4096;
  INFO(c.ToString());
  std::atomic<int> hooked{0};
  // The hook flips one byte of tile 1's destination (its first run) after the copy: a faulty
  // copy or a stale write as the read-back sees it.
  auto engine = CreateHostEngineForTest(2, [&](const Job& job, uint32_t tile) {
    ++hooked;
    if (tile != 1) return;
    bool flipped = false;
    planner::ForEachTileRun(job.plan(), tile, [&](const planner::CopyRun& run) {
      if (flipped) return;
      planner::HostAddress(job.plan().header().dst, job.dst_base(), run.dst)[run.bytes / 2] ^= 0x40;
      flipped = true;
    });
  });
  auto job = std::make_shared<DigestJob>(c, /*digest=*/true, rng);
  REQUIRE(job->plan().num_tiles() > 2);
  DigestJob::Run(*engine, job);
  const auto errors = job->errors();
  REQUIRE(errors.size() == 1);
  REQUIRE(errors.count(1) == 1);
  const absl::Status& s = errors.at(1);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  const std::string layer = std::to_string(c.spec.src().layer_begin() + job->plan().tile(1).layer);
  CHECK(std::string(s.message()).find("tile 1 (layer " + layer + ")") != std::string::npos);
  const auto digests = job->digests();
  CHECK(digests.at(1).first != digests.at(1).second);
  CHECK(digests.at(0).first == digests.at(0).second);
}

TEST_CASE("digest off: no tile is hashed") {
  std::mt19937_64 rng(5);
  std::atomic<int> hooked{0};
  auto engine = CreateHostEngineForTest(1, [&](const Job&, uint32_t) { ++hooked; });
  const planner::testing::RandomCase c = planner::testing::RandomServingCase(rng);
  auto job = std::make_shared<DigestJob>(c, /*digest=*/false, rng);
  DigestJob::Run(*engine, job);
  CHECK(job->errors().empty());
  CHECK(job->copied());
  CHECK(job->digests().empty());
  CHECK(hooked == 0);  // the digest path (copy-and-hash, read-back) was never entered
}

}  // namespace
}  // namespace kvrail::engine
