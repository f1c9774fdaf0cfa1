// The CUDA engine's pure decisions, without a GPU: the copy-engine descriptors of a tile range
// move exactly the host twin's bytes (random layouts, block tables, conversions), batches are
// consecutive tiles within the byte cap, the mode choice, and the CTA knee finder.
#include "daemon/scheduler/cuda_batch_policy.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/plan_math.h"

namespace kvrail::scheduler {
namespace {

void CheckRunsMatchHostTwin(const planner::testing::RandomCase& c, std::mt19937_64& rng) {
  INFO(c.ToString());
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> want(c.dst.size_bytes, 0xAB), got(c.dst.size_bytes, 0xAB);
  std::vector<CopyRun> runs;
  uint64_t run_bytes = 0;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    planner::ExecuteTileHost(*plan, t, src.data(), want.data());
    runs.clear();
    AppendTileRuns(*plan, t, &runs);
    for (const CopyRun& r : runs) {
      REQUIRE(r.src + r.bytes <= src.size());
      REQUIRE(r.dst + r.bytes <= got.size());
      std::memcpy(got.data() + r.dst, src.data() + r.src, r.bytes);
      run_bytes += r.bytes;
    }
  }
  CHECK(run_bytes == plan->bytes_total());
  CHECK(got == want);
}

// The kernel's segment path (plan_math.h: SegmentAt), replayed on the host: every tile's segment
// slots move exactly the host twin's bytes, none crosses a chunk, and a slot past the tile's end
// is empty.
void CheckSegmentsMatchHostTwin(const planner::testing::RandomCase& c, std::mt19937_64& rng) {
  INFO(c.ToString());
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  const kernels::PlanHeader& h = plan->header();
  if (static_cast<kernels::ChunkKind>(h.chunk_kind) == kernels::ChunkKind::kBytes) return;
  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> want(c.dst.size_bytes, 0xAB), got(c.dst.size_bytes, 0xAB);
  const uint64_t src_base = kernels::SideBase(h.src, reinterpret_cast<uint64_t>(src.data()));
  const uint64_t dst_base = kernels::SideBase(h.dst, reinterpret_cast<uint64_t>(got.data()));
  uint64_t moved = 0;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    planner::ExecuteTileHost(*plan, t, src.data(), want.data());
    const kernels::TileDesc tile = kernels::TileAt(h, t);
    uint64_t tile_moved = 0;
    for (uint64_t k = 0; k < kernels::SegmentsPerTile(h); ++k) {
      const kernels::ChunkSpan s =
          kernels::SegmentAt(h, plan->src_blocks().data(), plan->dst_blocks().data(), tile, k);
      if (s.bytes == 0) continue;
      REQUIRE(s.bytes <= h.chunk_bytes);
      const uint8_t* from = reinterpret_cast<const uint8_t*>(src_base + s.src);
      uint8_t* to = reinterpret_cast<uint8_t*>(dst_base + s.dst);
      REQUIRE(from >= src.data());
      REQUIRE(from + s.bytes <= src.data() + src.size());
      REQUIRE(to >= got.data());
      REQUIRE(to + s.bytes <= got.data() + got.size());
      std::memcpy(to, from, s.bytes);
      tile_moved += s.bytes;
    }
    CHECK(tile_moved == tile.byte_end - tile.byte_begin);
    moved += tile_moved;
  }
  CHECK(moved == plan->bytes_total());
  CHECK(got == want);
}

TEST_CASE("segment path: every tile's segments move exactly the host twin's bytes") {
  std::mt19937_64 rng(1919);
  for (int i = 0; i < 300; ++i) {
    CheckSegmentsMatchHostTwin(planner::testing::RandomPagedCase(rng), rng);
  }
  for (int i = 0; i < 30; ++i)
    CheckSegmentsMatchHostTwin(planner::testing::RandomServingCase(rng), rng);
}

TEST_CASE("copy-engine descriptors move exactly the host twin's bytes") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) CheckRunsMatchHostTwin(planner::testing::RandomPagedCase(rng), rng);
  for (int i = 0; i < 50; ++i) CheckRunsMatchHostTwin(planner::testing::RandomBytesCase(rng), rng);
}

TEST_CASE("batches are runs of consecutive tiles within the byte cap") {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 100; ++i) {
    auto c = planner::testing::RandomPagedCase(rng);
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    if (plan->num_tiles() == 0) continue;
    // Queue order as layer-wise marking can produce it: layers out of order.
    std::vector<uint32_t> order;
    for (uint32_t t = 0; t < plan->num_tiles(); ++t) order.push_back(t);
    std::shuffle(order.begin(), order.end(), rng);
    std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(order.size() / 2));
    TileRanges tiles(order.begin(), order.end());
    const uint64_t cap = 1 + rng() % (3 * plan->tile(0).bytes + 1);
    std::vector<int> seen(plan->num_tiles(), 0);
    while (!tiles.empty()) {
      const uint32_t front = tiles.front();
      auto [begin, end] = TakeBatch(&tiles, *plan, cap);
      REQUIRE(begin == front);
      REQUIRE(end > begin);
      uint64_t bytes = 0;
      for (uint32_t t = begin; t < end; ++t) {
        ++seen[t];
        bytes += plan->tile(t).bytes;
      }
      if (end - begin > 1) CHECK(bytes <= cap);
    }
    for (int s : seen) CHECK(s == 1);
  }
}

TEST_CASE("mode: copy engines for a zero budget, large runs or unreachable peers") {
  ModeInputs in;
  in.max_ctas = 32;
  in.mean_run_bytes = 16 << 10;
  in.copy_engine_min_run = 1 << 20;
  CHECK(ChooseMode(in) == Mode::kKernel);
  in.mean_run_bytes = 2 << 20;
  CHECK(ChooseMode(in) == Mode::kCopyEngine);
  in.mean_run_bytes = 16 << 10;
  in.max_ctas = 0;
  CHECK(ChooseMode(in) == Mode::kCopyEngine);
  in.max_ctas = 32;
  in.peer_unreachable = true;
  CHECK(ChooseMode(in) == Mode::kCopyEngine);
  CHECK(std::string(ModeEngineName(Mode::kKernel)) == "cuda-kernel");
  CHECK(std::string(ModeEngineName(Mode::kCopyEngine)) == "cuda-copy-engine");
}

TEST_CASE("copy-engine-only mode hands tiny-run plans to a small kernel, and says so") {
  ModeInputs in;
  in.max_ctas = 0;  // the operator asked for copy engines only
  in.copy_only_kernel_ctas = 4;
  in.copy_only_kernel_below_run = 128 << 10;
  // A TP1 -> TP4 head split of bf16 head_dim 128: 256-byte runs (0.05 GB/s on copy engines).
  in.mean_run_bytes = 256;
  ModeChoice c = ChoosePlanMode(in);
  CHECK(c.mode == Mode::kKernel);
  CHECK(c.max_ctas == 4);
  CHECK(c.copy_only_kernel);
  CHECK_FALSE(c.slow_copy_engine);
  CHECK(c.copy_engine_gbps < 0.1);
  CHECK(c.reason.find("cuda_max_ctas 0") != std::string::npos);
  CHECK(c.reason.find("256 B") != std::string::npos);
  CHECK(c.reason.find("at most 4 CTAs (cuda_copy_only_kernel_ctas)") != std::string::npos);
  CHECK(ChooseMode(in) == Mode::kKernel);
  // Just under the threshold: still the kernel; at it: the copy engines (and not called slow:
  // 128 KiB runs are expected near 29 GB/s).
  in.mean_run_bytes = (128 << 10) - 1;
  CHECK(ChoosePlanMode(in).mode == Mode::kKernel);
  in.mean_run_bytes = 128 << 10;
  c = ChoosePlanMode(in);
  CHECK(c.mode == Mode::kCopyEngine);
  CHECK(c.max_ctas == 0);
  CHECK_FALSE(c.copy_only_kernel);
  CHECK_FALSE(c.slow_copy_engine);
  CHECK(c.reason.empty());
  // Large runs stay on the copy engines silently.
  in.mean_run_bytes = 4 << 20;
  c = ChoosePlanMode(in);
  CHECK(c.mode == Mode::kCopyEngine);
  CHECK(c.reason.empty());
}

TEST_CASE("copy-engine-only mode with no kernel allowed keeps a slow plan but says why") {
  ModeInputs in;
  in.max_ctas = 0;
  in.copy_only_kernel_ctas = 0;  // the operator allows no kernel at all
  in.copy_only_kernel_below_run = 128 << 10;
  in.mean_run_bytes = 256;
  ModeChoice c = ChoosePlanMode(in);
  CHECK(c.mode == Mode::kCopyEngine);
  CHECK(c.slow_copy_engine);
  CHECK(c.reason.find("cuda_copy_only_kernel_ctas is 0") != std::string::npos);
  CHECK(c.reason.find("~0.06 GB/s") != std::string::npos);
  // A threshold set below a slow run size: the copy engines, marked slow, naming the threshold.
  in.copy_only_kernel_ctas = 4;
  in.copy_only_kernel_below_run = 1024;
  in.mean_run_bytes = 4096;  // ~0.9 GB/s expected
  c = ChoosePlanMode(in);
  CHECK(c.mode == Mode::kCopyEngine);
  CHECK(c.slow_copy_engine);
  CHECK(c.reason.find("cuda_copy_only_kernel_below_run_bytes 1024") != std::string::npos);
  // Unreachable peers: copy engines whatever the budget, marked slow for tiny runs.
  in.max_ctas = 32;
  in.peer_unreachable = true;
  in.mean_run_bytes = 256;
  c = ChoosePlanMode(in);
  CHECK(c.mode == Mode::kCopyEngine);
  CHECK(c.slow_copy_engine);
  CHECK(c.reason.find("no peer access") != std::string::npos);
}

TEST_CASE("with an SM budget nothing changes and nothing is said") {
  ModeInputs in;
  in.max_ctas = 32;
  in.copy_only_kernel_ctas = 4;
  in.copy_only_kernel_below_run = 128 << 10;
  in.copy_engine_min_run = 1 << 20;
  for (uint64_t run : {uint64_t{256}, uint64_t{657}, uint64_t{64} << 10, uint64_t{2} << 20}) {
    in.mean_run_bytes = run;
    const ModeChoice c = ChoosePlanMode(in);
    CHECK(c.reason.empty());
    CHECK_FALSE(c.copy_only_kernel);
    CHECK(c.max_ctas == (c.mode == Mode::kKernel ? 32 : 0));
  }
}

TEST_CASE("the copy-engine estimate follows the measured per-run cost") {
  CHECK(EstimateCopyEngineGbps(256) == Approx(0.0569).epsilon(0.01));
  CHECK(EstimateCopyEngineGbps(4096) == Approx(0.91).epsilon(0.01));
  CHECK(EstimateCopyEngineGbps(128 << 10) == Approx(29.1).epsilon(0.01));
  CHECK(EstimateCopyEngineGbps(uint64_t{1} << 40) == 1000.0);
}

// Real plans: a TP1 -> TP4 head split and an HND <-> NHD conversion have tiny mean runs.
TEST_CASE("random conversion plans with tiny runs go to the small kernel in copy-only mode") {
  std::mt19937_64 rng(19);
  int tiny = 0;
  for (int i = 0; i < 200; ++i) {
    auto rc = planner::testing::RandomPagedCase(rng);
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(rc.spec, rc.src, rc.dst, rc.options);
    REQUIRE(plan.ok());
    ModeInputs in;
    in.max_ctas = 0;
    in.copy_only_kernel_ctas = 2;
    in.copy_only_kernel_below_run = 128 << 10;
    in.mean_run_bytes = MeanRunBytes(*plan);
    const ModeChoice c = ChoosePlanMode(in);
    if (in.mean_run_bytes < (128 << 10)) {
      ++tiny;
      CHECK(c.mode == Mode::kKernel);
      CHECK(c.max_ctas == 2);
    } else {
      CHECK(c.mode == Mode::kCopyEngine);
    }
    // Never below the slow mark without a reason.
    if (c.mode == Mode::kCopyEngine && c.copy_engine_gbps < kCopyEngineSlowGbps) {
      CHECK_FALSE(c.reason.empty());
    }
  }
  CHECK(tiny > 0);
}

// Bandwidth as a function of CTAs with a knee at 16: 25 GB/s per CTA up to 400 GB/s.
double Curve(int ctas) { return std::min(400.0, 25.0 * ctas) + (ctas > 16 ? 5 : 0); }

TEST_CASE("the tuner probes every candidate, picks the knee and re-probes") {
  CtaTuner tuner(/*max_ctas=*/132, /*fixed=*/0, /*reprobe=*/10);
  CHECK(tuner.candidates() == std::vector<int>{132, 128, 64, 32, 16, 8, 4});
  const uint64_t bytes = 64 << 20;
  // Small batches are not samples: they run with the current choice and do not advance probing.
  CHECK(tuner.Next(4096) == 132);
  tuner.Report(132, 4096, 1e-6);
  CHECK(tuner.probing());
  std::vector<int> probed;
  while (tuner.probing()) {
    const int c = tuner.Next(bytes);
    probed.push_back(c);
    tuner.Report(c, bytes, bytes / (Curve(c) * 1e9));
  }
  // 8 CTAs (200 GB/s) fall out of the tolerance: 4 is never probed.
  CHECK(probed == std::vector<int>{132, 128, 64, 32, 16, 8});
  CHECK(tuner.knee() == 16);  // 400 GB/s >= 95% of 405
  CHECK(tuner.Describe() == "16 CTAs (knee)");
  for (int i = 0; i < 10; ++i) tuner.Report(tuner.Next(bytes), bytes, bytes / 400e9);
  CHECK(tuner.probing());
  CHECK(tuner.Next(bytes) == 132);
}

TEST_CASE("the tuner respects the budget and a fixed count") {
  CHECK(CtaTuner(32, 0, 10).candidates() == std::vector<int>{32, 16, 8, 4});
  CHECK(CtaTuner(24, 0, 10).candidates() == std::vector<int>{24, 16, 8, 4});
  CHECK(CtaTuner(3, 0, 10).candidates() == std::vector<int>{3, 2, 1});
  CtaTuner fixed(32, 8, 10);
  CHECK(fixed.Next(64 << 20) == 8);
  CHECK_FALSE(fixed.probing());
  CHECK(fixed.Describe() == "8 CTAs (fixed)");
  CHECK(CtaTuner(4, 64, 10).Next(64 << 20) == 4);  // fixed capped by the budget
}

TEST_CASE("a class's byte limit bounds its batches, never below one tile") {
  CHECK(ClassBatchBytes(64 << 20, 0, 0) == (64u << 20));             // no limit
  CHECK(ClassBatchBytes(64 << 20, 0, 1ull << 40) == (64u << 20));    // no limit, whatever in flight
  CHECK(ClassBatchBytes(64 << 20, 8 << 20, 0) == (8u << 20));        // the limit is smaller
  CHECK(ClassBatchBytes(64 << 20, 8 << 20, 6 << 20) == (2u << 20));  // what the limit leaves
  CHECK(ClassBatchBytes(64 << 20, 8 << 20, 9 << 20) == 0);           // over: TakeBatch takes 1 tile
  CHECK(ClassBatchBytes(4 << 20, 1ull << 30, 0) == (4u << 20));      // the batch size is smaller
}

TEST_CASE("batch sizes: background a quarter (at most 16 MiB); a job's batches ramp up") {
  CHECK(BatchBytesFor(/*background=*/false, 64 << 20) == (64u << 20));
  CHECK(BatchBytesFor(/*background=*/true, 64 << 20) == (16u << 20));
  CHECK(BatchBytesFor(/*background=*/true, 2) == 1);
  CHECK(BatchBytesFor(/*background=*/false, 256 << 20) == (256u << 20));
  CHECK(BatchBytesFor(/*background=*/true, 256 << 20) == (16u << 20));
  // A job's batches ramp up 16 -> 64 -> 256 MiB, never past the budget.
  CHECK(RampBatchBytes(256 << 20, 0) == (16u << 20));
  CHECK(RampBatchBytes(256 << 20, 16 << 20) == (64u << 20));
  CHECK(RampBatchBytes(256 << 20, 64 << 20) == (256u << 20));
  CHECK(RampBatchBytes(256 << 20, 256 << 20) == (256u << 20));
  CHECK(RampBatchBytes(8 << 20, 0) == (8u << 20));
  CHECK(RampBatchBytes(64 << 20, 1 << 20) == (16u << 20));  // a short first batch: 16 MiB next
}

TEST_CASE("ExecutingDevice: the GPU side, or between GPUs the source unless told the destination") {
  CHECK(ExecutingDevice(true, 0, true, 1, false, 7) == 0);
  CHECK(ExecutingDevice(true, 0, true, 1, true, 7) == 1);
  CHECK(ExecutingDevice(true, 3, true, 3, true, 7) == 3);     // same GPU either way
  CHECK(ExecutingDevice(true, 2, false, -1, true, 7) == 2);   // GPU -> host: the GPU
  CHECK(ExecutingDevice(false, -1, true, 1, false, 7) == 1);  // host -> GPU: the GPU
  CHECK(ExecutingDevice(false, -1, false, -1, true, 7) == 7);
}

// `n` tiles of 1 MiB in one bytes transfer.
planner::Plan MiBTiles(uint32_t n) {
  v1::TransferSpec spec;
  spec.set_num_bytes(uint64_t{n} << 20);
  planner::RegionView view{uint64_t{n} << 20, true, false, {}};
  planner::PlanOptions options;
  options.tile_bytes = 1 << 20;
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(spec, view, view, options);
  REQUIRE(plan.ok());
  return *std::move(plan);
}

TileRanges AllTiles(const planner::Plan& plan) {
  TileRanges tiles;
  for (uint32_t t = 0; t < plan.num_tiles(); ++t) tiles.push_back(t);
  return tiles;
}

TEST_CASE("a job's batches: ramp-cut ones say so; budget-cut and last ones do not") {
  const planner::Plan plan = MiBTiles(100);
  TileRanges tiles = AllTiles(plan);
  JobBatch b = TakeJobBatch(&tiles, plan, 64 << 20, 0);
  CHECK((b.begin == 0 && b.end == 16 && b.ramped));  // 16 MiB first
  b = TakeJobBatch(&tiles, plan, 64 << 20, 16 << 20);
  CHECK((b.begin == 16 && b.end == 80 && !b.ramped));  // the class's budget, not the ramp
  b = TakeJobBatch(&tiles, plan, 64 << 20, 64 << 20);
  CHECK((b.begin == 80 && b.end == 100 && !b.ramped));  // the job's end
  CHECK(tiles.empty());

  const planner::Plan small = MiBTiles(10);
  TileRanges few = AllTiles(small);
  b = TakeJobBatch(&few, small, 64 << 20, 0);
  CHECK((b.begin == 0 && b.end == 10 && !b.ramped));  // all of it fits the first aim
}

TEST_CASE("tuner keys: one per log2 of the mean run and destination kind") {
  CHECK(CtaTunerKey(4096, true, true) == 12 * 4 + 0);
  CHECK(CtaTunerKey(4096, true, false) == 12 * 4 + 1);   // a peer GPU's memory
  CHECK(CtaTunerKey(4096, false, false) == 12 * 4 + 2);  // host memory
  CHECK(CtaTunerKey(8191, true, true) == CtaTunerKey(4096, true, true));
  CHECK(CtaTunerKey(8192, true, true) != CtaTunerKey(4096, true, true));
  CHECK(CtaTunerKey(0, true, true) == 0);
  CHECK(CtaTunerKey(~uint64_t{0}, false, false) == 40 * 4 + 2);  // capped
}

TEST_CASE("split point: whole tiles from the end within the share, one tile kept on the kernel") {
  const planner::Plan plan = MiBTiles(64);
  CHECK(SplitPoint(plan, 0, 64, 0) == 64);
  CHECK(SplitPoint(plan, 0, 64, -1) == 64);
  CHECK(SplitPoint(plan, 0, 64, 0.3) == 45);  // 19 of 64 tiles (29.7%), not 20 (31.3%)
  CHECK(SplitPoint(plan, 10, 20, 0.25) == 18);
  CHECK(SplitPoint(plan, 0, 64, 1.0) == 1);  // never the whole batch
  CHECK(SplitPoint(plan, 0, 64, 5.0) == 1);
  CHECK(SplitPoint(plan, 5, 6, 0.9) == 6);     // one tile: nothing to split
  CHECK(SplitPoint(plan, 0, 64, 0.01) == 64);  // no whole tile fits
}

TEST_CASE("split: the kernel part and the copy-engine part move exactly the host twin's bytes") {
  std::mt19937_64 rng(19);
  for (int i = 0; i < 100; ++i) {
    auto c = planner::testing::RandomPagedCase(rng);
    INFO(c.ToString());
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    if (plan->num_tiles() == 0) continue;
    std::vector<uint8_t> src(c.src.size_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> want(c.dst.size_bytes, 0xAB), got(c.dst.size_bytes, 0xAB);
    const uint32_t n = plan->num_tiles();
    const uint32_t begin = static_cast<uint32_t>(rng() % n);
    const uint32_t end = begin + 1 + static_cast<uint32_t>(rng() % (n - begin));
    const double fraction = static_cast<double>(rng() % 100) / 100.0;
    const uint32_t split = SplitPoint(*plan, begin, end, fraction);
    REQUIRE(split > begin);
    REQUIRE(split <= end);
    uint64_t total = 0, copy = 0;
    for (uint32_t t = begin; t < end; ++t) {
      planner::ExecuteTileHost(*plan, t, src.data(), want.data());
      total += plan->tile(t).bytes;
      if (t < split) {
        planner::ExecuteTileHost(*plan, t, src.data(), got.data());  // the kernel's part
      } else {
        copy += plan->tile(t).bytes;
      }
    }
    std::vector<CopyRun> runs;
    for (uint32_t t = split; t < end; ++t) AppendTileRuns(*plan, t, &runs);
    for (const CopyRun& r : runs) {
      REQUIRE(r.src + r.bytes <= src.size());
      REQUIRE(r.dst + r.bytes <= got.size());
      std::memcpy(got.data() + r.dst, src.data() + r.src, r.bytes);
    }
    CHECK(static_cast<double>(copy) <= fraction * static_cast<double>(total) + 0.5);
    CHECK(got == want);
  }
}

TEST_CASE("balanced split: both sides end together") {
  CHECK(BalancedSplit(100, 300) == Approx(0.25));
  CHECK(BalancedSplit(0, 300) == 0);
  CHECK(BalancedSplit(50, 0) == 1);
}

// A model of one GPU: the kernel alone moves `kernel` GB/s, beside the copy engines `kernel *
// (1 - interference)`; the copy engines move `copy` GB/s. Returns the batch as the GPU's events
// would time it.
SplitSample Model(uint64_t bytes, double fraction, double kernel, double copy,
                  double interference) {
  SplitSample s;
  s.copy_bytes = static_cast<uint64_t>(fraction * static_cast<double>(bytes));
  s.kernel_bytes = bytes - s.copy_bytes;
  const double k = s.copy_bytes > 0 ? kernel * (1 - interference) : kernel;
  s.kernel_seconds = static_cast<double>(s.kernel_bytes) / (k * 1e9);
  s.copy_seconds = s.copy_bytes > 0 ? static_cast<double>(s.copy_bytes) / (copy * 1e9) : 0;
  s.total_seconds = std::max(s.kernel_seconds, s.copy_seconds);
  return s;
}

TEST_CASE("split tuner: measures the kernel alone, then converges to the balanced share") {
  // NVLink-like: kernel 368 GB/s, copy engines 160 at 128 KiB runs (the prior said 29).
  SplitTuner tuner(0.4, 0, 29.0, 256);
  const uint64_t bytes = 64 << 20;
  CHECK(tuner.phase() == SplitTuner::Phase::kBaseline);
  CHECK(tuner.Next(bytes) == 0);
  tuner.Report(Model(bytes, tuner.Next(bytes), 368, 160, 0.05));
  REQUIRE(tuner.phase() == SplitTuner::Phase::kSplit);
  CHECK(tuner.kernel_alone_gbps() == Approx(368).epsilon(0.01));
  // The first share comes from the prior: 29 / (29 + 368) = 7.3%.
  CHECK(tuner.Next(bytes) == Approx(29.0 / 397.0).epsilon(0.01));
  for (int i = 0; i < 30; ++i) tuner.Report(Model(bytes, tuner.Next(bytes), 368, 160, 0.05));
  REQUIRE(tuner.phase() == SplitTuner::Phase::kSplit);
  const double k = 368 * 0.95;
  CHECK(tuner.fraction() == Approx(160 / (160 + k)).epsilon(0.02));
  CHECK(tuner.copy_gbps() == Approx(160).epsilon(0.01));
  CHECK(tuner.split_gbps() > 1.3 * 368);  // both engines together beat the kernel alone
  CHECK(tuner.Describe().find("balanced") != std::string::npos);
  // Small batches are neither split nor sampled.
  CHECK(tuner.Next(1 << 20) == 0);
  const double before = tuner.fraction();
  tuner.Report(Model(1 << 20, 0, 368, 160, 0));
  CHECK(tuner.fraction() == before);
}

TEST_CASE("split tuner: off when the copy engines are too slow on these runs, without a probe") {
  // Same GPU, 4 KiB runs: copy engines ~0.9 GB/s against a 1250 GB/s kernel.
  SplitTuner tuner(0.4, 0, EstimateCopyEngineGbps(4096), 256);
  const uint64_t bytes = 64 << 20;
  tuner.Report(Model(bytes, tuner.Next(bytes), 1250, 0.9, 0));
  CHECK(tuner.phase() == SplitTuner::Phase::kOff);
  CHECK(tuner.Next(bytes) == 0);
  CHECK(tuner.Describe().find("copy engines off (copy engines ~0.9 GB/s") != std::string::npos);
}

TEST_CASE("split tuner: off when splitting moved less than the kernel alone, re-measured later") {
  // The copy engines look fast enough but take the kernel's bandwidth (shared HBM).
  SplitTuner tuner(0.4, 0, 200.0, 8);
  const uint64_t bytes = 64 << 20;
  tuner.Report(Model(bytes, tuner.Next(bytes), 400, 200, 0));
  REQUIRE(tuner.phase() == SplitTuner::Phase::kSplit);
  tuner.Report(Model(bytes, tuner.Next(bytes), 400, 200, 0.6));
  REQUIRE(tuner.phase() == SplitTuner::Phase::kOff);
  CHECK(tuner.Describe().find("the kernel alone 400.0") != std::string::npos);
  for (int i = 0; i < 7; ++i) {  // the losing split batch was the first of 8
    CHECK(tuner.Next(bytes) == 0);
    tuner.Report(Model(bytes, 0, 400, 200, 0));
  }
  CHECK(tuner.phase() == SplitTuner::Phase::kBaseline);  // re-measures after 8 sampled batches
  tuner.Report(Model(bytes, 0, 400, 200, 0));
  CHECK(tuner.phase() == SplitTuner::Phase::kSplit);  // the interference is gone: split again
  tuner.Report(Model(bytes, tuner.Next(bytes), 400, 200, 0));
  CHECK(tuner.phase() == SplitTuner::Phase::kSplit);
}

TEST_CASE("split tuner: a fixed share, the cap, and never") {
  SplitTuner fixed(0.4, 0.3, 29.0, 256);
  CHECK(fixed.phase() == SplitTuner::Phase::kFixed);
  CHECK(fixed.Next(64 << 20) == Approx(0.3));
  CHECK(fixed.Next(1 << 20) == Approx(0.3));
  CHECK(fixed.Describe().find("copy engines 30% (fixed") != std::string::npos);
  SplitTuner capped(0.2, 0.5, 29.0, 256);
  CHECK(capped.Next(64 << 20) == Approx(0.2));
  SplitTuner never(0, 0.3, 29.0, 256);
  CHECK(never.phase() == SplitTuner::Phase::kDisabled);
  CHECK(never.Next(64 << 20) == 0);
  // The learned share stays under the cap even when balance says more.
  SplitTuner learned(0.1, 0, 1000.0, 256);
  learned.Report(Model(64 << 20, 0, 100, 1000, 0));
  for (int i = 0; i < 10; ++i)
    learned.Report(Model(64 << 20, learned.Next(64 << 20), 100, 1000, 0));
  CHECK(learned.fraction() <= 0.1 + 1e-9);
  CHECK(learned.phase() == SplitTuner::Phase::kSplit);
}

TEST_CASE("launch CTAs: a critical batch is raised, the class cap wins, copy-only kernels never") {
  LaunchCtasInputs in;
  in.tuner_ctas = 32;
  LaunchCtas out = ChooseLaunchCtas(in);
  CHECK(out.ctas == 32);
  CHECK(out.tuner_sample());
  // Critical: raised to the critical count, and the tuner does not learn from it.
  in.critical = true;
  in.critical_ctas = 132;
  out = ChooseLaunchCtas(in);
  CHECK(out.ctas == 132);
  CHECK(out.raised);
  CHECK(!out.tuner_sample());
  // Never lowered by it.
  in.critical_ctas = 16;
  out = ChooseLaunchCtas(in);
  CHECK(out.ctas == 32);
  CHECK(!out.raised);
  CHECK(out.tuner_sample());
  // Not critical: the budget's choice.
  in.critical = false;
  in.critical_ctas = 132;
  CHECK(ChooseLaunchCtas(in).ctas == 32);
  // The class's max_ctas caps the raise (still above the tuner: raised and capped)...
  in.critical = true;
  in.class_max_ctas = 64;
  out = ChooseLaunchCtas(in);
  CHECK(out.ctas == 64);
  CHECK(out.capped);
  CHECK(out.raised);
  // ... and below the tuner's choice it is a plain cap.
  in.class_max_ctas = 16;
  out = ChooseLaunchCtas(in);
  CHECK(out.ctas == 16);
  CHECK(out.capped);
  CHECK(!out.raised);
  // The copy-engine-only mode's small kernels keep their count.
  in.class_max_ctas = 0;
  in.tuner_ctas = 4;
  in.copy_only_kernel = true;
  out = ChooseLaunchCtas(in);
  CHECK(out.ctas == 4);
  CHECK(out.tuner_sample());
}

TEST_CASE("critical CTAs: unset is one per SM; 0, copy-only mode or not above the budget is off") {
  CHECK(ResolveCriticalCtas(-1, 132, 32) == 132);
  CHECK(ResolveCriticalCtas(64, 132, 32) == 64);
  CHECK(ResolveCriticalCtas(264, 132, 32) == 264);
  CHECK(ResolveCriticalCtas(0, 132, 32) == 0);
  CHECK(ResolveCriticalCtas(-1, 132, 0) == 0);   // copy-engine-only mode
  CHECK(ResolveCriticalCtas(32, 132, 32) == 0);  // nothing above the budget
  CHECK(ResolveCriticalCtas(-1, 132, 200) == 0);
}

TEST_CASE("tuner seeds: scattered whole blocks, plans in their block size's tuner class") {
  const std::vector<uint64_t> sizes = TunerSeedBlockBytes();
  REQUIRE(sizes.size() == 6);
  CHECK(sizes.front() == 4096);
  CHECK(sizes.back() == 131072);
  for (uint64_t block : sizes) {
    INFO("block " << block);
    const SeedCase c = MakeSeedCase(block, kSeedScratchBytes);
    auto layout = planner::ResolveLayout(c.layout, kSeedScratchBytes, "seed.");
    REQUIRE(layout.ok());
    planner::RegionView view{kSeedScratchBytes, true, true, *layout};
    auto plan = planner::MakePlan(c.spec, view, view, planner::PlanOptions{});
    REQUIRE(plan.ok());
    // Every tuner sample is at least kMinSampleBytes, within the scratch.
    CHECK(plan->bytes_total() >= CtaTuner::kMinSampleBytes);
    CHECK(plan->bytes_total() <= kSeedScratchBytes);
    // Scattered: the runs are (about) single blocks, in the block size's class.
    CHECK(CtaTunerKey(MeanRunBytes(*plan), true, true) == CtaTunerKey(block, true, true));
    // Ids in range and distinct destinations: MakePlan checked them. As many blocks as the
    // scratch holds, at most kSeedMaxBlocks, each moved whole.
    const uint64_t n = std::min<uint64_t>(kSeedScratchBytes / block, kSeedMaxBlocks);
    CHECK(c.spec.src().block_ids_size() == static_cast<int>(n));
    CHECK(c.spec.dst().block_ids_size() == c.spec.src().block_ids_size());
    CHECK(plan->bytes_total() == n * block);
  }
}

TEST_CASE("a copy-engine run's cost from a probe: the scattered time beyond the contiguous one") {
  // 4096 runs of 4 KiB: 4.1 ms scattered against 0.05 ms contiguous -> ~0.99 us per run.
  CHECK(CopyEngineSecondsPerRun(4096, 4.1e-3, 0.05e-3) == Approx(0.989e-6).epsilon(0.01));
  // A probe that tells nothing leaves the pair at the default.
  CHECK(CopyEngineSecondsPerRun(1, 4e-3, 1e-3) == 0);
  CHECK(CopyEngineSecondsPerRun(4096, 0, 1e-3) == 0);
  CHECK(CopyEngineSecondsPerRun(4096, 1e-3, 0) == 0);
  CHECK(CopyEngineSecondsPerRun(4096, 1e-3, 2e-3) == 0);
}

TEST_CASE("copy-engine costs per GPU pair: measured pairs, the default elsewhere") {
  CopyEngineCosts costs;
  CHECK(costs.Describe().empty());
  costs.Set(0, 1, 0.8e-6);
  costs.Set(0, 0, 4.2e-6);
  costs.Set(1, 0, 0);  // a failed probe: ignored
  CHECK(costs.SecondsPerRun(0, 1) == 0.8e-6);
  CHECK(costs.SecondsPerRun(0, 0) == 4.2e-6);
  CHECK(costs.SecondsPerRun(1, 0) == kCopyEngineSecondsPerRun);
  CHECK(costs.SecondsPerRun(2, 3) == kCopyEngineSecondsPerRun);
  CHECK(costs.measured(0, 1));
  CHECK_FALSE(costs.measured(1, 0));
  CHECK(costs.Describe() == "GPU0 -> GPU0 4.20 us, GPU0 -> GPU1 0.80 us per copy-engine run");
  CHECK(EstimateCopyEngineGbps(16 << 10, 0.8e-6) == Approx(20.48).epsilon(0.001));
  CHECK(EstimateCopyEngineGbps(16 << 10, 0) == EstimateCopyEngineGbps(16 << 10));
}

// The split decision with injected costs: the SplitTuner's prior comes from ChoosePlanMode's
// estimate, which now takes the pair's measured cost. Across GPUs (0.8 us per run) the copy
// engines take a share of 16-32 KiB plans that the one-GPU constant (4.5 us) kept them out of.
TEST_CASE("a measured cross-GPU copy-engine cost turns the kernel + copy-engine split on") {
  const uint64_t bytes = 64 << 20;
  for (uint64_t run : {uint64_t{16} << 10, uint64_t{32} << 10}) {
    CAPTURE(run);
    ModeInputs in;
    in.max_ctas = 32;
    in.mean_run_bytes = run;
    const ModeChoice constant = ChoosePlanMode(in);
    in.copy_engine_seconds_per_run = 0.8e-6;
    const ModeChoice measured = ChoosePlanMode(in);
    REQUIRE(constant.mode == Mode::kKernel);
    REQUIRE(measured.mode == Mode::kKernel);
    CHECK(measured.copy_engine_gbps == Approx(static_cast<double>(run) / 0.8e-6 / 1e9));
    // Kernel alone 350 GB/s GPU0 -> GPU1; the copy engines move what the measured cost says.
    const double copy_gbps = static_cast<double>(run) / 0.8e-6 / 1e9;
    SplitTuner with_constant(0.4, 0, constant.copy_engine_gbps, 256);
    with_constant.Report(Model(bytes, with_constant.Next(bytes), 350, copy_gbps, 0));
    CHECK(with_constant.phase() == SplitTuner::Phase::kOff);
    SplitTuner with_measured(0.4, 0, measured.copy_engine_gbps, 256);
    with_measured.Report(Model(bytes, with_measured.Next(bytes), 350, copy_gbps, 0));
    REQUIRE(with_measured.phase() == SplitTuner::Phase::kSplit);
    CHECK(with_measured.Next(bytes) == Approx(copy_gbps / (copy_gbps + 350)).epsilon(0.01));
  }
  // Same GPU, 4 KiB runs, measured at the constant's cost: still off.
  ModeInputs in;
  in.max_ctas = 32;
  in.mean_run_bytes = 4096;
  in.copy_engine_seconds_per_run = 4.5e-6;
  SplitTuner same_gpu(0.4, 0, ChoosePlanMode(in).copy_engine_gbps, 256);
  same_gpu.Report(Model(bytes, same_gpu.Next(bytes), 1250, 0.9, 0));
  CHECK(same_gpu.phase() == SplitTuner::Phase::kOff);
}

}  // namespace
}  // namespace kvrail::scheduler
