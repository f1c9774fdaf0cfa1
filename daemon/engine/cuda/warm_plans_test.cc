// Plans kept warm (warm_plans.h) on the fake GPU: the cache alone (a buffer whose last holder's
// kernels may still run is never handed out, eviction order, the bounds), and through the
// dispatcher (a repeated shape uploads its ids only and lands byte for byte, a job holding its
// buffer keeps its ids while another job of its shape gets a buffer of its own, failed uploads
// leave no entry behind, gated jobs keep out).
#include "daemon/engine/cuda/warm_plans.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/engine/cuda/dispatcher_test_rig.h"
#include "daemon/engine/cuda/fake_gpu_ops.h"
#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"

namespace kvrail::engine::cuda_detail {
namespace {

using testing::LayeredCase;
using testing::ManyBatchCase;
using testing::Rig;
using testing::TestJob;
using testing::TestOptions;

// A plan uploaded to the fake GPU (any plan: the cache never looks inside).
std::unique_ptr<GpuPlan> Uploaded(FakeGpuOps& fake) {
  static const planner::Plan* plan = [] {
    std::mt19937_64 rng(30);
    const planner::testing::RandomCase c = planner::testing::RandomPagedCase(rng);
    return new planner::Plan(*planner::MakePlan(c.spec, c.src, c.dst, c.options));
  }();
  absl::StatusOr<std::unique_ptr<GpuPlan>> gpu =
      fake.UploadPlan(*plan, nullptr, nullptr, fake.main_stream(), nullptr, 0);
  REQUIRE(gpu.ok());
  return *std::move(gpu);
}

TEST_CASE("warm plans alone: a buffer whose last holder's kernels may still run is kept back") {
  FakeGpuOps fake;
  WarmPlans warm(&fake, {4, 1 << 20});
  std::unique_ptr<GpuPlan> plan = Uploaded(fake);
  fake.set_auto_run(false);
  // Its holder's last kernel is queued, not run, when the holder gives the buffer back.
  REQUIRE(fake.LaunchCopy(*plan, 0, 0, 1, fake.main_stream()).ok());
  warm.Give(WarmPlans::Ticket{"shape", 100, nullptr}, std::move(plan));
  CHECK(warm.entries() == 1);
  CHECK_FALSE(warm.Take("shape").has_value());  // the fake's event: not passed
  CHECK(warm.entries() == 1);
  fake.Run();
  std::optional<WarmPlans::Kept> kept = warm.Take("shape");
  REQUIRE(kept.has_value());
  CHECK(kept->plan != nullptr);
  CHECK(kept->ticket.bytes == 100);
  CHECK(warm.entries() == 0);
  CHECK(warm.bytes() == 0);
  CHECK_FALSE(warm.Take("shape").has_value());
  CHECK_FALSE(warm.Take("another shape").has_value());
}

TEST_CASE("warm plans alone: the least recently given back goes first, by entries and bytes") {
  FakeGpuOps fake;
  WarmPlans warm(&fake, {3, 1000});
  auto give = [&](const std::string& key, size_t bytes) {
    warm.Give(WarmPlans::Ticket{key, bytes, nullptr}, Uploaded(fake));
  };
  give("a", 100);
  give("b", 100);
  give("c", 100);
  // "a" used again: now the most recently given back.
  std::optional<WarmPlans::Kept> a = warm.Take("a");
  REQUIRE(a.has_value());
  warm.Give(std::move(a->ticket), std::move(a->plan));
  give("d", 100);  // 4 entries: "b" goes
  CHECK(warm.entries() == 3);
  CHECK(warm.bytes() == 300);
  give("big", 800);  // 1100 bytes: "c" goes
  CHECK(warm.entries() == 3);
  CHECK(warm.bytes() == 1000);
  give("huge", 1001);  // larger than the bound: not kept, nothing evicted for it
  CHECK(warm.entries() == 3);
  CHECK_FALSE(warm.Take("b").has_value());
  CHECK_FALSE(warm.Take("c").has_value());
  CHECK_FALSE(warm.Take("huge").has_value());
  for (const char* key : {"a", "d", "big"}) {
    INFO(key);
    CHECK(warm.Take(key).has_value());
  }
  CHECK(warm.entries() == 0);
  give("e", 10);
  give("e", 10);  // two buffers of one shape (two jobs were in flight)
  CHECK(warm.entries() == 2);
  warm.Clear();
  CHECK(warm.entries() == 0);
  CHECK(warm.bytes() == 0);
  CHECK_FALSE(warm.Take("e").has_value());
}

TEST_CASE("warm plans alone: nothing kept with no room") {
  FakeGpuOps fake;
  WarmPlans warm(&fake, {});
  CHECK_FALSE(warm.enabled());
  warm.Give(WarmPlans::Ticket{"a", 1, nullptr}, Uploaded(fake));
  CHECK(warm.entries() == 0);
}

// Buffers several jobs share: jobs over the same regions, whose plans differ in block ids only,
// have one shape (kernels::PlanShapeKey).
struct Regions {
  std::vector<uint8_t> src, dst;
};

// A transfer over shared regions, recording its reports. While `more` is set it may get more
// tiles (as a layer-wise job between layers): the dispatcher keeps its state, and its plan.
class SharedJob final : public Job, public DeviceSides {
 public:
  SharedJob(const planner::testing::RandomCase& c, std::shared_ptr<Regions> r)
      : r_(std::move(r)), plan_(*planner::MakePlan(c.spec, c.src, c.dst, c.options)) {}
  DeviceSides* device_sides() const override { return const_cast<SharedJob*>(this); }
  const planner::Plan& plan() const override { return plan_; }
  const uint8_t* src_base() const override { return r_->src.data(); }
  uint8_t* dst_base() const override { return r_->dst.data(); }
  Placement src() const override { return {true, 0, r_->src.data()}; }
  Placement dst() const override { return {true, 0, r_->dst.data()}; }
  absl::StatusOr<uint8_t*> DeviceAddress(Side side, int) const override {
    return side == Side::kSrc ? r_->src.data() : r_->dst.data();
  }
  PriorityClass priority() const override { return PriorityClass::kNormal; }
  bool MayGetMoreTiles() const override { return more_.load(); }
  void OnTileStart(uint32_t) override {}
  void OnTileDone(uint32_t tile, const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    statuses_[tile] = status;
  }
  void set_more(bool on) { more_ = on; }
  std::vector<uint32_t> Tiles(uint32_t begin, uint32_t end) const {
    std::vector<uint32_t> t;
    for (uint32_t i = begin; i < end; ++i) t.push_back(i);
    return t;
  }
  size_t reported() const {
    absl::MutexLock lock(&mu_);
    return statuses_.size();
  }
  bool AllOk() const {
    absl::MutexLock lock(&mu_);
    for (const auto& [tile, status] : statuses_) {
      if (!status.ok()) return false;
    }
    return statuses_.size() == plan_.num_tiles();
  }
  bool AllFailed() const {
    absl::MutexLock lock(&mu_);
    for (const auto& [tile, status] : statuses_) {
      if (status.ok()) return false;
    }
    return statuses_.size() == plan_.num_tiles();
  }
  // The host twin's bytes for tiles [begin, end) of this job, into `want`.
  void Expect(std::vector<uint8_t>& want, uint32_t begin, uint32_t end) const {
    for (uint32_t t = begin; t < end; ++t) {
      planner::ExecuteTileHost(plan_, t, r_->src.data(), want.data());
    }
  }

 private:
  std::shared_ptr<Regions> r_;
  planner::Plan plan_;
  std::atomic<bool> more_{false};
  mutable absl::Mutex mu_;
  std::map<uint32_t, absl::Status> statuses_ ABSL_GUARDED_BY(mu_);
};

// A paged case of several batches (TestOptions' 1 KiB batches) with its regions.
struct SharedCase {
  planner::testing::RandomCase c;
  std::shared_ptr<Regions> regions;
};
SharedCase MakeSharedCase(std::mt19937_64& rng) {
  SharedCase out{ManyBatchCase(rng), std::make_shared<Regions>()};
  out.regions->src.resize(out.c.src.size_bytes);
  for (auto& b : out.regions->src) b = static_cast<uint8_t>(rng() | 1);
  out.regions->dst.assign(out.c.dst.size_bytes, 0);
  return out;
}

// The same transfer with other block ids (source ids drawn again, destination ids shuffled):
// the same shape.
planner::testing::RandomCase OtherIds(const planner::testing::RandomCase& c, std::mt19937_64& rng) {
  planner::testing::RandomCase o = c;
  auto* src = o.spec.mutable_src()->mutable_block_ids();
  for (auto& id : *src) id = static_cast<uint32_t>(rng() % c.src.layout.num_blocks);
  auto* dst = o.spec.mutable_dst()->mutable_block_ids();
  std::shuffle(dst->begin(), dst->end(), rng);
  return o;
}

// Bytes of the id section of `job`'s plan image.
uint64_t IdBytes(const SharedJob& job) {
  return 4 * (job.plan().src_blocks().size() + job.plan().dst_blocks().size());
}

double Gauge(const WorkerStats& stats, const std::string& name) { return stats.Gauges().at(name); }

// Turns until every tile of `job` reported and no job state is left.
void RunToEnd(Rig& rig, const SharedJob& job) {
  REQUIRE(rig.TurnUntil(
      [&] { return job.reported() == job.plan().num_tiles() && rig.dispatcher.states() == 0; }));
}

// The destination holds what the host twin wrote (compared as one value: no byte dump).
bool Landed(const Regions& r, const std::vector<uint8_t>& want) { return r.dst == want; }

TEST_CASE("warm plans: a repeated shape uploads only its ids and lands byte for byte") {
  std::mt19937_64 rng(31);
  for (const bool staged : {true, false}) {
    CudaEngineOptions o = TestOptions();
    o.staged_plan_upload = staged;
    Rig rig(o);
    for (int n = 0; n < 6; ++n) {
      SharedCase sc = MakeSharedCase(rng);
      INFO("staged " << staged << ": " << sc.c.ToString());
      std::vector<uint8_t> want = sc.regions->dst;
      uint64_t bytes = rig.fake.upload_bytes();
      const int made = rig.fake.plans_made();
      planner::testing::RandomCase c = sc.c;
      for (int k = 0; k < 3; ++k) {
        auto job = std::make_shared<SharedJob>(c, sc.regions);
        job->Expect(want, 0, job->plan().num_tiles());
        rig.queues.Enqueue(job, job->Tiles(0, job->plan().num_tiles()));
        RunToEnd(rig, *job);
        CHECK(job->AllOk());
        CHECK(Landed(*sc.regions, want));
        // The first job of the shape uploads its whole image, the later ones their ids only.
        const uint64_t sent = rig.fake.upload_bytes() - bytes;
        if (k == 0) {
          CHECK(sent > IdBytes(*job));
        } else {
          CHECK(sent == IdBytes(*job));
        }
        bytes = rig.fake.upload_bytes();
        CHECK(rig.fake.plans_made() == made + 1);
        c = OtherIds(c, rng);
      }
      // Another tile size: another shape, a buffer of its own.
      c.options.tile_bytes = c.options.tile_bytes == 1 ? 16 : 1;
      auto other = std::make_shared<SharedJob>(c, sc.regions);
      other->Expect(want, 0, other->plan().num_tiles());
      rig.queues.Enqueue(other, other->Tiles(0, other->plan().num_tiles()));
      RunToEnd(rig, *other);
      CHECK(other->AllOk());
      CHECK(Landed(*sc.regions, want));
      CHECK(rig.fake.plans_made() == made + 2);
    }
    CHECK(Gauge(rig.stats, "warm_plan_hits_total") == 12);
    CHECK(Gauge(rig.stats, "warm_plan_misses_total") == 12);
    CHECK(Gauge(rig.stats, "warm_plans") == rig.dispatcher.warm_plans().entries());
    CHECK(rig.fake.overwrites_while_read() == 0);
    CHECK(rig.stats.Describe(0, 8, 0).find("12 jobs uploaded their block ids only") !=
          std::string::npos);
  }
}

TEST_CASE(
    "warm plans: a job holding its buffer keeps its ids; another job of its shape gets its "
    "own buffer") {
  std::mt19937_64 rng(32);
  Rig rig;
  for (int n = 0; n < 4; ++n) {
    SharedCase sc = MakeSharedCase(rng);
    INFO(sc.c.ToString());
    std::vector<uint8_t> want = sc.regions->dst;
    const int made = rig.fake.plans_made();
    auto a = std::make_shared<SharedJob>(sc.c, sc.regions);
    const uint32_t tiles = a->plan().num_tiles(), half = tiles / 2;
    a->set_more(true);  // as a layer-wise job between layers: its state (and plan) stay
    rig.queues.Enqueue(a, a->Tiles(0, half));
    REQUIRE(rig.TurnUntil([&] { return a->reported() == half; }));
    a->Expect(want, 0, half);
    // B, the same shape with other ids, comes while A still holds its buffer: its own buffer.
    auto b = std::make_shared<SharedJob>(OtherIds(sc.c, rng), sc.regions);
    rig.queues.Enqueue(b, b->Tiles(0, tiles));
    REQUIRE(rig.TurnUntil([&] { return b->reported() == tiles; }));
    b->Expect(want, 0, tiles);
    CHECK(rig.fake.plans_made() == made + 2);
    // A's later tiles run on its own ids.
    a->set_more(false);
    rig.queues.Enqueue(a, a->Tiles(half, tiles));
    RunToEnd(rig, *a);
    a->Expect(want, half, tiles);
    CHECK(a->AllOk());
    CHECK(b->AllOk());
    CHECK(Landed(*sc.regions, want));
    // Both buffers are kept now; the next job of the shape takes one of them.
    auto c = std::make_shared<SharedJob>(OtherIds(sc.c, rng), sc.regions);
    c->Expect(want, 0, tiles);
    rig.queues.Enqueue(c, c->Tiles(0, tiles));
    RunToEnd(rig, *c);
    CHECK(c->AllOk());
    CHECK(Landed(*sc.regions, want));
    CHECK(rig.fake.plans_made() == made + 2);
  }
  CHECK(rig.fake.overwrites_while_read() == 0);
}

TEST_CASE("warm plans: failed uploads leave no entry behind") {
  std::mt19937_64 rng(33);
  Rig rig;
  SharedCase sc = MakeSharedCase(rng);
  INFO(sc.c.ToString());
  std::vector<uint8_t> want = sc.regions->dst;
  auto run = [&](const std::shared_ptr<SharedJob>& job) {
    rig.queues.Enqueue(job, job->Tiles(0, job->plan().num_tiles()));
    RunToEnd(rig, *job);
  };
  SECTION("the whole upload fails: the job fails, nothing is kept, the next job uploads whole") {
    rig.fake.FailNext("UploadPlan", absl::InternalError("cudaMallocAsync refused"));
    auto failed = std::make_shared<SharedJob>(sc.c, sc.regions);
    run(failed);
    CHECK(failed->AllFailed());
    CHECK(Landed(*sc.regions, want));
    CHECK(rig.dispatcher.warm_plans().entries() == 0);
    auto next = std::make_shared<SharedJob>(OtherIds(sc.c, rng), sc.regions);
    next->Expect(want, 0, next->plan().num_tiles());
    const int made = rig.fake.plans_made();
    run(next);
    CHECK(next->AllOk());
    CHECK(Landed(*sc.regions, want));
    CHECK(rig.fake.plans_made() == made + 1);
    CHECK(rig.dispatcher.warm_plans().entries() == 1);
  }
  SECTION("the id upload fails: that buffer is dropped, the job uploads its whole plan") {
    auto first = std::make_shared<SharedJob>(sc.c, sc.regions);
    first->Expect(want, 0, first->plan().num_tiles());
    run(first);
    REQUIRE(rig.dispatcher.warm_plans().entries() == 1);
    rig.fake.FailNext("UploadBlockIds", absl::InternalError("cudaMemcpyAsync refused"));
    auto second = std::make_shared<SharedJob>(OtherIds(sc.c, rng), sc.regions);
    second->Expect(want, 0, second->plan().num_tiles());
    const int made = rig.fake.plans_made();
    run(second);
    CHECK(second->AllOk());
    CHECK(Landed(*sc.regions, want));
    CHECK(rig.fake.plans_made() == made + 1);  // a fresh buffer, not the one half written
    CHECK(rig.dispatcher.warm_plans().entries() == 1);
    CHECK(Gauge(rig.stats, "warm_plan_id_upload_failures_total") == 1);
    CHECK(rig.stats.Describe(0, 8, 0).find("cudaMemcpyAsync refused") != std::string::npos);
    // The kept buffer is the fresh one: the next job's ids go there and land.
    auto third = std::make_shared<SharedJob>(OtherIds(sc.c, rng), sc.regions);
    third->Expect(want, 0, third->plan().num_tiles());
    run(third);
    CHECK(third->AllOk());
    CHECK(Landed(*sc.regions, want));
    CHECK(rig.fake.plans_made() == made + 1);
  }
  SECTION("a sticky fault drops every kept buffer") {
    auto first = std::make_shared<SharedJob>(sc.c, sc.regions);
    run(first);
    REQUIRE(rig.dispatcher.warm_plans().entries() == 1);
    rig.fake.FailNext("Wait", absl::InternalError("cudaErrorIllegalAddress"), /*sticky=*/true);
    auto second = std::make_shared<SharedJob>(OtherIds(sc.c, rng), sc.regions);
    run(second);
    CHECK_FALSE(rig.stats.broken().ok());
    CHECK(rig.dispatcher.warm_plans().entries() == 0);
    CHECK(Gauge(rig.stats, "warm_plans") == 0);
  }
  CHECK(rig.fake.overwrites_while_read() == 0);
}

TEST_CASE("warm plans: off, and never for a gated job") {
  std::mt19937_64 rng(34);
  SECTION("off: every job uploads its whole plan") {
    CudaEngineOptions o = TestOptions();
    o.warm_plans = false;
    Rig rig(o);
    SharedCase sc = MakeSharedCase(rng);
    for (int k = 0; k < 3; ++k) {
      auto job = std::make_shared<SharedJob>(OtherIds(sc.c, rng), sc.regions);
      rig.queues.Enqueue(job, job->Tiles(0, job->plan().num_tiles()));
      RunToEnd(rig, *job);
      CHECK(job->AllOk());
    }
    CHECK(rig.fake.plans_made() == 3);
    CHECK(rig.fake.id_uploads() == 0);
    CHECK(rig.dispatcher.warm_plans().entries() == 0);
  }
  SECTION("a gated job's plan (its tile count zeroed by the abort) is never kept") {
    Rig rig;
    auto job = std::make_shared<TestJob>(LayeredCase(rng), rng);
    REQUIRE(rig.Admit(job));
    rig.queues.Enqueue(job, job->AllTiles());
    for (uint32_t l = 0; l < job->plan().num_layers(); ++l) job->Write(l);
    REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
    REQUIRE(rig.TurnUntil([&] { return rig.dispatcher.states() == 0; }));
    CHECK(rig.dispatcher.warm_plans().entries() == 0);
    CHECK(Gauge(rig.stats, "warm_plan_misses_total") == 0);
    rig.gate.Reap();
  }
}

}  // namespace
}  // namespace kvrail::engine::cuda_detail
