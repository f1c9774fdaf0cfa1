#include "daemon/scheduler/cuda_batch_policy.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/plan_math.h"

namespace kvrail::scheduler {

void AppendTileRuns(const planner::Plan& plan, uint32_t tile, std::vector<CopyRun>* runs) {
  planner::ForEachTileRun(plan, tile, [runs](const CopyRun& run) { runs->push_back(run); });
}

uint64_t MeanRunBytes(const planner::Plan& plan) {
  const uint64_t runs = std::max<uint64_t>(plan.num_runs(), 1);
  return plan.bytes_total() / runs;
}

std::pair<uint32_t, uint32_t> TakeBatch(TileRanges* tiles, const planner::Plan& plan,
                                        uint64_t max_bytes) {
  const uint32_t begin = tiles->front();
  uint64_t bytes = plan.tile(begin).bytes;
  tiles->pop_front();
  uint32_t end = begin + 1;
  while (!tiles->empty() && tiles->front() == end) {
    const uint64_t next = plan.tile(end).bytes;
    if (bytes + next > max_bytes) break;
    bytes += next;
    tiles->pop_front();
    ++end;
  }
  return {begin, end};
}

uint64_t ClassBatchBytes(uint64_t batch_bytes, uint64_t max_inflight, uint64_t inflight) {
  if (max_inflight == 0) return batch_bytes;
  const uint64_t left = max_inflight > inflight ? max_inflight - inflight : 0;
  return std::min(batch_bytes, left);
}

uint64_t BatchBytesFor(bool background, uint64_t batch_bytes) {
  if (!background) return batch_bytes;
  return std::min<uint64_t>(std::max<uint64_t>(batch_bytes / 4, 1), kMaxBackgroundBatchBytes);
}

uint64_t RampBatchBytes(uint64_t budget, uint64_t previous) {
  const uint64_t cap = previous == 0 ? kFirstBatchBytes : std::max(kFirstBatchBytes, 4 * previous);
  return std::min(budget, cap);
}

JobBatch TakeJobBatch(TileRanges* tiles, const planner::Plan& plan, uint64_t budget,
                      uint64_t previous) {
  const uint64_t aim = RampBatchBytes(budget, previous);
  const auto [begin, end] = TakeBatch(tiles, plan, aim);
  return JobBatch{begin, end, aim < budget && !tiles->empty()};
}

int CtaTunerKey(uint64_t mean_run_bytes, bool dst_cuda, bool dst_on_executing_device) {
  int log2 = 0;
  while ((uint64_t{2} << log2) <= mean_run_bytes && log2 < 40) ++log2;
  return log2 * 4 + (dst_cuda ? (dst_on_executing_device ? 0 : 1) : 2);
}

int ExecutingDevice(bool src_cuda, int src_device, bool dst_cuda, int dst_device,
                    bool run_on_destination, int fallback) {
  if (src_cuda && dst_cuda) return run_on_destination ? dst_device : src_device;
  if (src_cuda) return src_device;
  if (dst_cuda) return dst_device;
  return fallback;
}

const char* ModeEngineName(Mode mode) {
  return mode == Mode::kKernel ? "cuda-kernel" : "cuda-copy-engine";
}

Mode ChooseMode(const ModeInputs& in) { return ChoosePlanMode(in).mode; }

double EstimateCopyEngineGbps(uint64_t mean_run_bytes, double seconds_per_run) {
  const double per_run = seconds_per_run > 0 ? seconds_per_run : kCopyEngineSecondsPerRun;
  return std::min(1000.0, static_cast<double>(mean_run_bytes) / per_run / 1e9);
}

double CopyEngineSecondsPerRun(uint64_t runs, double scattered_seconds, double contiguous_seconds) {
  if (runs < 2 || scattered_seconds <= 0 || contiguous_seconds <= 0 ||
      scattered_seconds <= contiguous_seconds) {
    return 0;
  }
  return (scattered_seconds - contiguous_seconds) / static_cast<double>(runs);
}

void CopyEngineCosts::Set(int executing, int other, double seconds_per_run) {
  if (seconds_per_run > 0) seconds_[{executing, other}] = seconds_per_run;
}

double CopyEngineCosts::SecondsPerRun(int executing, int other) const {
  const auto it = seconds_.find({executing, other});
  return it == seconds_.end() ? kCopyEngineSecondsPerRun : it->second;
}

std::string CopyEngineCosts::Describe() const {
  std::string out;
  for (const auto& [pair, seconds] : seconds_) {
    absl::StrAppend(
        &out, out.empty() ? "" : ", ",
        absl::StrFormat("GPU%d -> GPU%d %.2f us", pair.first, pair.second, seconds * 1e6));
  }
  return out.empty() ? out : absl::StrCat(out, " per copy-engine run");
}

namespace {

std::string RunSize(uint64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes >= 1024 && bytes % 1024 == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

}  // namespace

ModeChoice ChoosePlanMode(const ModeInputs& in) {
  ModeChoice c;
  c.copy_engine_gbps = EstimateCopyEngineGbps(in.mean_run_bytes, in.copy_engine_seconds_per_run);
  const bool slow = c.copy_engine_gbps < kCopyEngineSlowGbps;
  const double per_run = in.copy_engine_seconds_per_run > 0 ? in.copy_engine_seconds_per_run
                                                            : kCopyEngineSecondsPerRun;
  const std::string runs = absl::StrFormat(
      "its contiguous runs average %s (copy engines ~%.2f GB/s at ~%.1f us per run%s)",
      RunSize(in.mean_run_bytes), c.copy_engine_gbps, per_run * 1e6,
      in.copy_engine_seconds_per_run > 0 ? ", measured" : "");
  if (in.peer_unreachable) {
    c.mode = Mode::kCopyEngine;
    if (slow) {
      c.slow_copy_engine = true;
      c.reason = absl::StrCat(
          "copy engines: the GPUs have no peer access, so no kernel reaches "
          "both sides; ",
          runs);
    }
    return c;
  }
  if (in.max_ctas <= 0) {
    const bool small_runs = in.mean_run_bytes < in.copy_only_kernel_below_run;
    if (small_runs && in.copy_only_kernel_ctas > 0) {
      c.mode = Mode::kKernel;
      c.max_ctas = in.copy_only_kernel_ctas;
      c.copy_only_kernel = true;
      c.reason = absl::StrCat("copy-engine-only mode (cuda_max_ctas 0), but ", runs,
                              ", under cuda_copy_only_kernel_below_run_bytes ",
                              in.copy_only_kernel_below_run, ": a kernel of at most ",
                              in.copy_only_kernel_ctas, " CTAs (cuda_copy_only_kernel_ctas)");
      return c;
    }
    c.mode = Mode::kCopyEngine;
    if (slow) {
      c.slow_copy_engine = true;
      c.reason = absl::StrCat(
          "copy-engine-only mode (cuda_max_ctas 0) keeps a slow plan on the copy engines: ", runs,
          in.copy_only_kernel_ctas > 0
              ? absl::StrCat(", at or above cuda_copy_only_kernel_below_run_bytes ",
                             in.copy_only_kernel_below_run)
              : std::string(", and cuda_copy_only_kernel_ctas is 0 (no kernel allowed)"));
    }
    return c;
  }
  if (in.copy_engine_min_run > 0 && in.mean_run_bytes >= in.copy_engine_min_run) {
    c.mode = Mode::kCopyEngine;
    return c;
  }
  c.mode = Mode::kKernel;
  c.max_ctas = in.max_ctas;
  return c;
}

CtaTuner::CtaTuner(int max_ctas, int fixed_ctas, int reprobe_batches, double tolerance)
    : fixed_(fixed_ctas > 0 ? std::min(fixed_ctas, std::max(max_ctas, 1)) : 0),
      reprobe_batches_(std::max(reprobe_batches, 1)),
      tolerance_(tolerance) {
  max_ctas = std::max(max_ctas, 1);
  candidates_.push_back(max_ctas);
  int c = 1;
  while (c * 2 <= max_ctas) c *= 2;
  if (c == max_ctas) c /= 2;
  for (; c >= 4 || (c >= 1 && max_ctas < 4); c /= 2) candidates_.push_back(c);
  knee_ = fixed_ > 0 ? fixed_ : max_ctas;
  if (fixed_ > 0) probing_ = false;
}

int CtaTuner::Next(uint64_t bytes) const {
  if (fixed_ > 0) return fixed_;
  if (probing_ && bytes >= kMinSampleBytes) return candidates_[probe_index_];
  return knee_;
}

void CtaTuner::Report(int ctas, uint64_t bytes, double seconds) {
  if (fixed_ > 0 || bytes < kMinSampleBytes || seconds <= 0) return;
  const double gbps = static_cast<double>(bytes) / seconds / 1e9;
  if (probing_) {
    if (ctas != candidates_[probe_index_]) return;
    measured_[ctas] = gbps;
    double best = 0;
    for (size_t i = 0; i <= probe_index_; ++i) best = std::max(best, measured_[candidates_[i]]);
    // Bandwidth only falls with fewer CTAs: once a candidate drops out of the tolerance, the
    // smaller ones would too, and probing them would only slow real transfers.
    if (++probe_index_ == candidates_.size() || gbps < (1.0 - tolerance_) * best) FinishProbe();
    return;
  }
  measured_[ctas] = gbps;
  if (++batches_since_probe_ >= reprobe_batches_) {
    probing_ = true;
    probe_index_ = 0;
  }
}

void CtaTuner::FinishProbe() {
  probing_ = false;
  probe_index_ = 0;
  batches_since_probe_ = 0;
  double best = 0;
  for (int c : candidates_) {
    if (measured_.count(c) != 0) best = std::max(best, measured_[c]);
  }
  knee_ = candidates_.front();
  for (int c : candidates_) {  // descending: the last one within tolerance is the fewest CTAs
    if (measured_.count(c) != 0 && measured_[c] >= (1.0 - tolerance_) * best) knee_ = c;
  }
}

std::string CtaTuner::Describe() const {
  if (fixed_ > 0) return absl::StrCat(fixed_, " CTAs (fixed)");
  if (probing_) {
    return absl::StrCat(knee_, " CTAs (", measured_.empty() ? "not probed yet" : "re-probing", ")");
  }
  return absl::StrCat(knee_, " CTAs (knee)");
}

std::vector<uint64_t> TunerSeedBlockBytes() {
  std::vector<uint64_t> out;
  for (uint64_t b = 4 << 10; b <= (128 << 10); b *= 2) out.push_back(b);
  return out;
}

SeedCase MakeSeedCase(uint64_t block_bytes, uint64_t scratch_bytes) {
  SeedCase c;
  const uint32_t blocks = static_cast<uint32_t>(scratch_bytes / block_bytes);
  kvrail::v1::PagedKvLayout& l = c.layout;
  l.set_num_layers(1);
  l.set_num_parts(1);
  l.set_num_blocks(blocks);
  l.set_num_heads(1);
  l.set_head_dim(128);
  l.set_dtype(kvrail::v1::DTYPE_BF16);
  l.set_tokens_per_block(static_cast<uint32_t>(block_bytes / 256));
  l.set_order(kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  std::vector<uint32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0u);
  std::mt19937 rng(19);
  const uint32_t n = std::min(blocks, kSeedMaxBlocks);
  for (auto* side : {c.spec.mutable_src(), c.spec.mutable_dst()}) {
    std::shuffle(ids.begin(), ids.end(), rng);
    side->mutable_block_ids()->Add(ids.begin(), ids.begin() + n);
  }
  return c;
}

LaunchCtas ChooseLaunchCtas(const LaunchCtasInputs& in) {
  LaunchCtas out;
  out.ctas = in.tuner_ctas;
  if (in.critical && !in.copy_only_kernel && in.critical_ctas > out.ctas) {
    out.ctas = in.critical_ctas;
    out.raised = true;
  }
  if (in.class_max_ctas > 0 && out.ctas > in.class_max_ctas) {
    out.ctas = in.class_max_ctas;
    out.capped = true;
    out.raised = out.raised && out.ctas > in.tuner_ctas;
  }
  return out;
}

int ResolveCriticalCtas(int configured, int sm_count, int max_ctas) {
  if (max_ctas <= 0 || configured == 0) return 0;
  const int ctas = configured < 0 ? sm_count : configured;
  return ctas > max_ctas ? ctas : 0;
}

}  // namespace kvrail::scheduler

namespace kvrail::scheduler {

uint32_t SplitPoint(const planner::Plan& plan, uint32_t begin, uint32_t end, double fraction) {
  if (fraction <= 0 || end - begin < 2) return end;
  uint64_t total = 0;
  for (uint32_t t = begin; t < end; ++t) total += plan.tile(t).bytes;
  const double limit = std::min(fraction, 1.0) * static_cast<double>(total);
  uint64_t taken = 0;
  uint32_t split = end;
  // Whole tiles from the end while they stay within the share; the first tile stays on the kernel.
  while (split - 1 > begin) {
    const uint64_t next = taken + plan.tile(split - 1).bytes;
    if (static_cast<double>(next) > limit) break;
    taken = next;
    --split;
  }
  return split;
}

double BalancedSplit(double copy_gbps, double kernel_gbps) {
  if (copy_gbps <= 0) return 0;
  if (kernel_gbps <= 0) return 1;
  return copy_gbps / (copy_gbps + kernel_gbps);
}

SplitTuner::SplitTuner(double max_fraction, double fixed_fraction, double copy_gbps_prior,
                       int reprobe_batches, double tolerance)
    : max_(std::clamp(max_fraction, 0.0, 0.9)),
      fixed_(std::clamp(fixed_fraction, 0.0, max_)),
      reprobe_batches_(std::max(reprobe_batches, 1)),
      tolerance_(tolerance),
      copy_gbps_(copy_gbps_prior) {
  if (max_ <= 0) {
    phase_ = Phase::kDisabled;
  } else if (fixed_ > 0) {
    phase_ = Phase::kFixed;
    fraction_ = fixed_;
  } else {
    phase_ = Phase::kBaseline;
  }
}

double SplitTuner::Next(uint64_t bytes) const {
  switch (phase_) {
    case Phase::kFixed:
      return fixed_;
    case Phase::kSplit:
      return bytes >= kMinSampleBytes ? fraction_ : 0;
    default:
      return 0;
  }
}

void SplitTuner::StartSplitOrOff() {
  const double want = std::min(max_, BalancedSplit(copy_gbps_, kernel_gbps_));
  if (want < kMinFraction) {
    phase_ = Phase::kOff;
    fraction_ = 0;
    off_reason_ = absl::StrFormat(
        "copy engines %s%.1f GB/s on these runs against the kernel's %.1f: a balanced share "
        "would be %.1f%%, under %.0f%%",
        copy_measured_ ? "" : "~", copy_gbps_, kernel_gbps_, 100 * want, 100 * kMinFraction);
    return;
  }
  phase_ = Phase::kSplit;
  fraction_ = want;
}

void SplitTuner::Report(const SplitSample& s) {
  const uint64_t bytes = s.kernel_bytes + s.copy_bytes;
  if (phase_ == Phase::kDisabled || bytes < kMinSampleBytes || s.total_seconds <= 0) return;
  const double total = static_cast<double>(bytes) / s.total_seconds / 1e9;
  if (s.kernel_bytes > 0 && s.kernel_seconds > 0) {
    kernel_gbps_ = static_cast<double>(s.kernel_bytes) / s.kernel_seconds / 1e9;
  }
  if (s.copy_bytes > 0 && s.copy_seconds > 0) {
    copy_gbps_ = static_cast<double>(s.copy_bytes) / s.copy_seconds / 1e9;
    copy_measured_ = true;
  }
  switch (phase_) {
    case Phase::kFixed:
      (s.copy_bytes > 0 ? split_gbps_ : baseline_gbps_) = total;
      return;
    case Phase::kBaseline:
      if (s.copy_bytes != 0) return;  // launched before the re-measure began
      baseline_gbps_ = total;
      batches_since_baseline_ = 0;
      StartSplitOrOff();
      return;
    case Phase::kSplit: {
      if (s.copy_bytes == 0) break;  // a batch too small to split
      split_gbps_ = total;
      if (total < (1.0 - tolerance_) * baseline_gbps_) {
        phase_ = Phase::kOff;
        off_reason_ =
            absl::StrFormat("%.0f%% on the copy engines moved %.1f GB/s, the kernel alone %.1f",
                            100.0 * static_cast<double>(s.copy_bytes) / static_cast<double>(bytes),
                            total, baseline_gbps_);
        fraction_ = 0;
        break;
      }
      const double want = std::min(max_, BalancedSplit(copy_gbps_, kernel_gbps_));
      fraction_ = 0.5 * (fraction_ + want);
      if (fraction_ < kMinFraction) StartSplitOrOff();
      break;
    }
    default:
      break;
  }
  if (++batches_since_baseline_ >= reprobe_batches_) {
    phase_ = Phase::kBaseline;
    fraction_ = 0;
    batches_since_baseline_ = 0;
  }
}

std::string SplitTuner::Describe() const {
  switch (phase_) {
    case Phase::kDisabled:
      return "copy engines never (cuda_copy_split_max_percent 0)";
    case Phase::kFixed:
      return absl::StrFormat("copy engines %.0f%% (fixed; %.1f GB/s together)", 100 * fixed_,
                             split_gbps_);
    case Phase::kBaseline:
      return "copy engines: measuring the kernel alone";
    case Phase::kSplit:
      return absl::StrFormat(
          "copy engines %.0f%% (balanced: kernel %.1f + copy engines %.1f GB/s side by side, "
          "%.1f together, kernel alone %.1f)",
          100 * fraction_, kernel_gbps_, copy_gbps_, split_gbps_, baseline_gbps_);
    case Phase::kOff:
      return absl::StrCat("copy engines off (", off_reason_, ")");
  }
  return "";
}

}  // namespace kvrail::scheduler
