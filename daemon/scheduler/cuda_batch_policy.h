// The CUDA engine's scheduling decisions as pure functions, testable without a GPU (the engine
// only executes them): which tiles form one launch (batch size per class, the ramp), the GPU that
// runs a job, the copy-engine descriptors of a tile range (the host twin's coalesced copies), the
// kernel-or-copy-engine choice, and the CTA knee finder. No CUDA, no threads, no clocks.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/scheduler/tile_ranges.h"

namespace kvrail::scheduler {

// One contiguous copy: byte offsets from the two region bases.
using CopyRun = planner::CopyRun;

// Appends the coalesced copies of `tile` (exactly the memcpys ExecuteTileHost does).
void AppendTileRuns(const planner::Plan& plan, uint32_t tile, std::vector<CopyRun>* runs);

// Average bytes of the plan's coalesced contiguous runs.
uint64_t MeanRunBytes(const planner::Plan& plan);

// Takes from the front of `tiles` the longest prefix of consecutive tile ids (t, t+1, ...) whose
// bytes stay within `max_bytes` (always at least one tile) and returns it as [begin, end).
std::pair<uint32_t, uint32_t> TakeBatch(TileRanges* tiles, const planner::Plan& plan,
                                        uint64_t max_bytes);

// The bytes the next batch of a priority class may aim for: `batch_bytes`, within what the class's
// `max_inflight` (0: no limit) leaves beside its `inflight` bytes; TakeBatch still takes at least
// one tile.
uint64_t ClassBatchBytes(uint64_t batch_bytes, uint64_t max_inflight, uint64_t inflight);

// The batch size a class aims for before its limits: the background class's batches are a
// quarter of `batch_bytes`, at most kMaxBackgroundBatchBytes. Preemption is at batch granularity
// and up to two batches sit on the stream, so a critical transfer arriving behind background work
// waits for those first: with 64 MiB batches (~190 µs each on NVLink) that was most of a 16 MiB
// critical transfer's p99 once submits and waits stopped costing gRPC round trips
// (docs/benchmarks.md).
uint64_t BatchBytesFor(bool background, uint64_t batch_bytes);
// Background batches never exceed this (larger configured batches must not delay a critical
// transfer behind background work more than the default did).
inline constexpr uint64_t kMaxBackgroundBatchBytes = 16 << 20;

// A job's batches ramp up: its first aims for at most kFirstBatchBytes, each later one for at most
// 4x the one before, up to `budget`. The GPU starts sooner on a new job, and the dispatcher checks
// the next batch's block ids (deferred checks: ~134 us for a 256 MiB batch of 4 KiB blocks on
// the GPU machine) while the smaller batch before it runs, instead of with the GPU idle.
// `previous`: bytes of the job's last batch (0: none yet).
inline constexpr uint64_t kFirstBatchBytes = 16 << 20;
uint64_t RampBatchBytes(uint64_t budget, uint64_t previous);

// A job's next batch from the front of its queued `tiles`: TakeBatch at the ramp's aim
// (RampBatchBytes(budget, previous)). `ramped`: the ramp, not the class's budget or the job's
// end, cut it short (its launch overhead weighs more, so such batches do not train the CTA
// tuner).
struct JobBatch {
  uint32_t begin = 0, end = 0;  // tiles [begin, end)
  bool ramped = false;
};
JobBatch TakeJobBatch(TileRanges* tiles, const planner::Plan& plan, uint64_t budget,
                      uint64_t previous);

// The GPU that runs a job: the one GPU side when the other is host memory; between two GPUs the
// source, or the destination with `run_on_destination`; `fallback` when neither side is a GPU.
int ExecutingDevice(bool src_cuda, int src_device, bool dst_cuda, int dst_device,
                    bool run_on_destination, int fallback);

enum class Mode { kKernel, kCopyEngine };
const char* ModeEngineName(Mode mode);  // "cuda-kernel" / "cuda-copy-engine"

struct ModeInputs {
  int max_ctas = 0;                  // SM budget
  uint64_t mean_run_bytes = 0;       // MeanRunBytes(plan)
  uint64_t copy_engine_min_run = 0;  // options.copy_engine_min_run_bytes
  bool peer_unreachable = false;     // GPU -> other GPU without peer access
  // Copy-engine-only mode (max_ctas 0): plans whose mean run is below `copy_only_kernel_below_run`
  // run on a kernel of at most `copy_only_kernel_ctas` CTAs (0: never). options.copy_only_*.
  int copy_only_kernel_ctas = 0;
  uint64_t copy_only_kernel_below_run = 0;
  // The copy engines' cost per run between the plan's two GPUs as measured at start
  // (CopyEngineCosts); 0: not measured, kCopyEngineSecondsPerRun.
  double copy_engine_seconds_per_run = 0;
};
// Copy engines when the budget is zero, the runs are large, or the two GPUs cannot reach each
// other directly (the driver stages the copy through host memory); else the kernel. The
// copy-engine-only exception is ChoosePlanMode's; this is ChoosePlanMode(in).mode.
Mode ChooseMode(const ModeInputs& in);

// The copy engines' cost per contiguous run (cudaMemcpyBatchAsync, one descriptor per run) where
// it was not measured: one H200, GPU0 -> GPU0 (docs/benchmarks.md: 4 KiB runs 1.0 GB/s, 128 KiB
// runs 26 GB/s, 256-byte head vectors 0.05-0.07 GB/s, i.e. ~4-5 us per run whatever its size).
// Between two GPUs a run costs less (0.6-1.0 us), so the engine measures each GPU pair at start
// (CopyEngineCosts). Below kCopyEngineSlowGbps a plan on them is called slow (no plan under
// 20 GB/s without a reason shown).
inline constexpr double kCopyEngineSecondsPerRun = 4.5e-6;
inline constexpr double kCopyEngineSlowGbps = 20.0;
// Coarse expected copy-engine rate of a plan whose runs average `mean_run_bytes`: one run per
// `seconds_per_run` (kCopyEngineSecondsPerRun when 0), at most 1000 GB/s. For the operator's
// message, the slow mark and the SplitTuner's prior (whether the copy engines may take a share).
double EstimateCopyEngineGbps(uint64_t mean_run_bytes, double seconds_per_run = 0);

// The copy engines' cost per run from one probe: `runs` runs (one cudaMemcpyBatchAsync) took
// `scattered_seconds`, the same bytes as one contiguous copy `contiguous_seconds`; what each run
// costs beyond its bytes. 0 when the probe tells nothing (under 2 runs, a time not positive, or
// the runs not slower than the contiguous copy).
double CopyEngineSecondsPerRun(uint64_t runs, double scattered_seconds, double contiguous_seconds);

// The copy engines' measured cost per run, by (executing GPU, other GPU): the other GPU is the
// one the executing GPU's copies read from or write to (itself for a same-GPU plan). Pairs never
// measured (no peer access, a failed probe, the warm-up off) cost kCopyEngineSecondsPerRun.
// Not thread-safe (one per device dispatcher: written by its warm-up, read by its set-ups).
class CopyEngineCosts {
 public:
  // Records a measurement; one that is not positive is ignored (the pair keeps the default).
  void Set(int executing, int other, double seconds_per_run);
  double SecondsPerRun(int executing, int other) const;
  bool measured(int executing, int other) const { return seconds_.count({executing, other}) != 0; }
  // "GPU0 -> GPU0 4.2 us, GPU0 -> GPU1 0.8 us per copy-engine run" ("" when none measured).
  std::string Describe() const;

 private:
  std::map<std::pair<int, int>, double> seconds_;
};

// The mode of one plan and what to tell the operator about it.
struct ModeChoice {
  Mode mode = Mode::kKernel;
  // Kernel: the most CTAs its launches may use (the SM budget, or copy_only_kernel_ctas when the
  // copy-engine-only mode handed the plan to a kernel). 0 for the copy engines.
  int max_ctas = 0;
  // The copy-engine-only mode (max_ctas 0) handed this plan to a small kernel.
  bool copy_only_kernel = false;
  // The plan stays on the copy engines although they are expected below kCopyEngineSlowGbps.
  bool slow_copy_engine = false;
  double copy_engine_gbps = 0;  // EstimateCopyEngineGbps(mean_run_bytes)
  // Empty when the choice is the ordinary one; else one sentence for TransferStatus.path_reason
  // and the log, naming the setting that decided and the expected rate.
  std::string reason;
};
ModeChoice ChoosePlanMode(const ModeInputs& in);

// Which CtaTuner a job's batches use: one per run-size class (log2 of the mean run, capped at 40)
// and destination kind (the executing GPU's own memory, a peer GPU's, host memory), since the
// knee moves with both.
int CtaTunerKey(uint64_t mean_run_bytes, bool dst_cuda, bool dst_on_executing_device);

// Finds the knee of bandwidth over CTA count: the fewest CTAs within `tolerance` (5%) of the best
// measured bandwidth. Probes the candidates (the budget and powers of two from 4) once each,
// largest first, on batches of at least kMinSampleBytes, stopping at the first one that falls out
// of the tolerance (fewer CTAs never move more), then uses the knee; re-probes every
// `reprobe_batches` sampled batches. Not thread-safe (one per device dispatcher and size class).
class CtaTuner {
 public:
  static constexpr uint64_t kMinSampleBytes = 4 << 20;
  CtaTuner(int max_ctas, int fixed_ctas, int reprobe_batches, double tolerance = 0.05);

  // CTAs for the next batch of `bytes`.
  int Next(uint64_t bytes) const;
  // A finished batch: `ctas` moved `bytes` in `seconds` (GPU time).
  void Report(int ctas, uint64_t bytes, double seconds);
  // The current choice and why: "16 CTAs (knee)", "32 CTAs (probing)", "8 CTAs (fixed)".
  std::string Describe() const;
  int knee() const { return knee_; }
  bool probing() const { return probing_; }
  const std::vector<int>& candidates() const { return candidates_; }
  // Last measured GB/s per candidate (0: not measured).
  const std::map<int, double>& measured() const { return measured_; }

 private:
  void FinishProbe();

  const int fixed_;
  const int reprobe_batches_;
  const double tolerance_;
  std::vector<int> candidates_;  // descending
  std::map<int, double> measured_;
  bool probing_ = true;
  size_t probe_index_ = 0;
  int knee_;
  int batches_since_probe_ = 0;
};

// The CTAs of one kernel launch, on the critical path. The SM budget (cuda_max_ctas, the
// CtaTuner's candidates) spares SMs for the inference server's compute; a critical-priority
// transfer is what that compute is waiting for (a decode step's KV), so its batches are raised to
// `critical_ctas` (16 MiB GPU0 -> GPU0: ~20 us of GPU at 32 CTAs, ~12 at 132; docs/benchmarks.md).
// The class's own max_ctas (an explicit operator cap) still wins, and the copy-engine-only mode's
// small kernels are never raised (that mode spares the SMs on purpose).
struct LaunchCtasInputs {
  int tuner_ctas = 0;      // CtaTuner::Next
  int class_max_ctas = 0;  // ClassLimits.max_ctas of the batch's class (0: no cap)
  bool critical = false;   // the batch's class is PriorityClass::kCritical
  int critical_ctas = 0;   // ResolveCriticalCtas (0: not raised)
  bool copy_only_kernel = false;
};
struct LaunchCtas {
  int ctas = 0;
  bool capped = false;  // lowered to the class's max_ctas
  bool raised = false;  // raised for a critical transfer
  // Only the tuner's own choice teaches it the knee.
  bool tuner_sample() const { return !capped && !raised; }
};
LaunchCtas ChooseLaunchCtas(const LaunchCtasInputs& in);

// cuda_critical_ctas for one GPU: `configured` < 0 (the setting unset) is one CTA per SM
// (`sm_count`); 0 turns the raise off; otherwise `configured`. 0 in copy-engine-only mode
// (`max_ctas` 0) and whenever the result is not above the budget (nothing to raise).
int ResolveCriticalCtas(int configured, int sm_count, int max_ctas);

// Seeding the CTA tuners at start (unseeded, the knee probe cost the first transfer ~100 us of
// GPU time, one 48-64 MiB batch at half the CTAs). Before serving, each GPU's dispatcher runs the
// tuner's own probe on scratch memory for the serving layouts' run sizes, whole scattered blocks
// of 4 KiB to 128 KiB on the GPU's own memory, so the first transfers find their knee known.
// Other classes (head-vector runs, a peer GPU's or host memory) still probe on first use.
inline constexpr uint64_t kSeedScratchBytes = 64 << 20;  // per side
inline constexpr uint32_t kSeedMaxBlocks = 8192;
std::vector<uint64_t> TunerSeedBlockBytes();  // 4096, 8192, ..., 131072
// One seed probe's transfer: a one-layer NHD layout of `scratch_bytes` in blocks of
// `block_bytes` (a multiple of 256), and a spec moving min(blocks, kSeedMaxBlocks) scattered
// blocks (distinct ids from a fixed shuffle) within it; source and destination use the same
// layout. Its plan's MeanRunBytes lies in `block_bytes`' CtaTunerKey class.
struct SeedCase {
  kvrail::v1::PagedKvLayout layout;
  kvrail::v1::TransferSpec spec;
};
SeedCase MakeSeedCase(uint64_t block_bytes, uint64_t scratch_bytes);

// Kernel and copy engines together: a kernel batch's last tiles go to the copy
// engines (cudaMemcpyBatchAsync on a second stream) while the kernel moves the rest. Tiles
// [begin, split) run on the kernel, [split, end) on the copy engines: whole tiles from the end,
// at most `fraction` of the batch's bytes, at least one tile on the kernel. `end` (no copy-engine
// part) when `fraction` <= 0, the batch is one tile, or no tile fits.
uint32_t SplitPoint(const planner::Plan& plan, uint32_t begin, uint32_t end, double fraction);

// The share of bytes at which the two sides end together: copy / (copy + kernel), each side's
// GB/s as measured beside the other.
double BalancedSplit(double copy_gbps, double kernel_gbps);

// One finished batch as the SplitTuner sees it: the kernel part and the copy-engine part, each
// timed from the batch's start to its own end (GPU events), and the whole batch.
struct SplitSample {
  uint64_t kernel_bytes = 0, copy_bytes = 0;
  double kernel_seconds = 0, copy_seconds = 0, total_seconds = 0;
};

// Learns the copy engines' share of a kernel batch, one per run-size class (CtaTunerKey), as the
// CtaTuner learns the knee: measures the kernel alone on one batch of at least kMinSampleBytes,
// derives the balanced share from the copy engines' expected rate (`copy_gbps_prior`,
// EstimateCopyEngineGbps of the class's runs) and, when it is worth it (at least kMinFraction),
// runs batches at that share, re-balancing after each from both sides' measured rates (halfway to
// the new balance). Off when the balanced share is under kMinFraction (the copy engines are too
// slow on these runs to matter) or when a split batch moves less than the kernel alone did
// (beyond `tolerance`): the two compete for memory or links. Re-measures the kernel alone every
// `reprobe_batches` sampled batches. `fixed_fraction` > 0 pins the share (measuring); a
// `max_fraction` of 0 never splits. Not thread-safe (one per device dispatcher and size class).
class SplitTuner {
 public:
  static constexpr uint64_t kMinSampleBytes = 4 << 20;
  static constexpr double kMinFraction = 0.03;
  SplitTuner(double max_fraction, double fixed_fraction, double copy_gbps_prior,
             int reprobe_batches, double tolerance = 0.02);

  // The share of the bytes of the next batch (of `bytes`) to hand to the copy engines.
  double Next(uint64_t bytes) const;
  void Report(const SplitSample& sample);
  // "copy engines 27% (balanced: kernel 268 GB/s + copy engines 101 GB/s = 369, kernel alone
  // 350)", "copy engines off (...why...)", "copy engines: measuring the kernel alone".
  std::string Describe() const;

  enum class Phase { kDisabled, kFixed, kBaseline, kSplit, kOff };
  Phase phase() const { return phase_; }
  double fraction() const { return fraction_; }
  double kernel_alone_gbps() const { return baseline_gbps_; }
  double copy_gbps() const { return copy_gbps_; }
  double split_gbps() const { return split_gbps_; }

 private:
  void StartSplitOrOff();

  const double max_;
  const double fixed_;
  const int reprobe_batches_;
  const double tolerance_;
  Phase phase_;
  double fraction_ = 0;
  double copy_gbps_;  // the copy engines beside the kernel (prior until measured)
  bool copy_measured_ = false;
  double kernel_gbps_ = 0;    // the kernel part (beside the copy engines when split)
  double baseline_gbps_ = 0;  // the whole batch with the kernel alone
  double split_gbps_ = 0;     // the whole batch, latest split sample
  int batches_since_baseline_ = 0;
  std::string off_reason_;
};

}  // namespace kvrail::scheduler
