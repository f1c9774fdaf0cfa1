// The CUDA engine's warm-up (CudaEngineOptions::warm_up; see warm_up.h).
#include "daemon/engine/cuda/warm_up.h"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/cuda/cuda_util.h"
#include "base/status.h"
#include "daemon/engine/cuda/gpu_ops.h"
#include "daemon/planner/planner.h"
#include "daemon/scheduler/cuda_batch_policy.h"
#include "kernels/kv_copy.h"

namespace kvrail::engine::cuda_detail {

namespace {

// Stream-ordered pool memory kept between plan buffers (cudaMemPoolAttrReleaseThreshold).
constexpr uint64_t kRetainedPoolBytes = 64 << 20;

// The CTA tuners' knee probes for the serving run sizes (scheduler::TunerSeedBlockBytes) on
// scratch memory, so no early transfer runs a probe batch at half the CTAs. Returns the
// Describe text ("CTA knees seeded ...").
absl::StatusOr<std::string> SeedTuners(const CudaEngineOptions& options, Tuners& tuners,
                                       cudaStream_t stream) {
  if (options.max_ctas <= 0 || options.fixed_ctas > 0) return std::string();
  const absl::Time t0 = absl::Now();
  const uint64_t scratch_bytes = scheduler::kSeedScratchBytes;
  void* scratch[2] = {nullptr, nullptr};
  absl::Cleanup free_scratch = [&scratch] {
    for (void* p : scratch) {
      if (p != nullptr) cudaFree(p);
    }
  };
  for (void*& p : scratch) {
    KVRAIL_RETURN_IF_ERROR(
        cuda::CudaStatus(cudaMalloc(&p, scratch_bytes), "cudaMalloc(CTA tuner seed scratch)"));
  }
  KVRAIL_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create());
  KVRAIL_ASSIGN_OR_RETURN(cuda::Event stop, cuda::Event::Create());
  std::string knees;
  int probes = 0;
  for (uint64_t block : scheduler::TunerSeedBlockBytes()) {
    const scheduler::SeedCase c = scheduler::MakeSeedCase(block, scratch_bytes);
    KVRAIL_ASSIGN_OR_RETURN(const planner::KvLayout layout,
                            planner::ResolveLayout(c.layout, scratch_bytes, "tuner seed: "));
    const planner::RegionView view{scratch_bytes, true, true, layout, nullptr};
    KVRAIL_ASSIGN_OR_RETURN(const planner::Plan plan,
                            planner::MakePlan(c.spec, view, view, planner::PlanOptions{}));
    scheduler::CtaTuner& tuner = tuners.Cta(
        scheduler::CtaTunerKey(scheduler::MeanRunBytes(plan), true, true), options.max_ctas);
    // Pageable tables without staging: copied before Upload returns.
    KVRAIL_ASSIGN_OR_RETURN(kernels::DevicePlanBuffer buffer,
                            kernels::DevicePlanBuffer::Upload(
                                plan.header(), plan.src_blocks().data(), plan.dst_blocks().data(),
                                reinterpret_cast<uint64_t>(scratch[0]),
                                reinterpret_cast<uint64_t>(scratch[1]), stream, nullptr, 0));
    // The tuner's own probe, as a transfer's batches would run it (at most one per candidate).
    for (size_t i = 0; tuner.probing() && i < tuner.candidates().size(); ++i) {
      const int ctas = tuner.Next(plan.bytes_total());
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventRecord(start.get(), stream), "cudaEventRecord"));
      KVRAIL_RETURN_IF_ERROR(
          kernels::LaunchKvCopy(buffer.plan(), 0, plan.num_tiles(), ctas, stream, kThreadsPerCta));
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventRecord(stop.get(), stream), "cudaEventRecord"));
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventSynchronize(stop.get()), "CTA tuner seed probe"));
      float ms = 0;
      cudaEventElapsedTime(&ms, start.get(), stop.get());
      tuner.Report(ctas, plan.bytes_total(), ms / 1e3);
      ++probes;
    }
    absl::StrAppend(&knees, knees.empty() ? "" : ", ", block >> 10, " KiB ", tuner.knee());
  }
  KVRAIL_RETURN_IF_ERROR(
      cuda::CudaStatus(cudaStreamSynchronize(stream), "CTA tuner seed (plan buffers freed)"));
  return absl::StrFormat(", CTA knees seeded in %.1f ms by %d probes on scratch blocks (%s)",
                         absl::ToDoubleMilliseconds(absl::Now() - t0), probes, knees);
}

// The copy engines' cost per run from this GPU to itself and to each peer GPU it can reach
// (CopyEngineSecondsPerRun of a scattered batch vs one contiguous copy), for the plans' mode
// choice and the SplitTuner's prior. Returns the Describe text.
absl::StatusOr<std::string> MeasureCopyEngineCosts(int device, Tuners& tuners,
                                                   cudaStream_t main_stream) {
  // 2048 runs of 4 KiB, every other 4 KiB of a 16 MiB scratch on each side (adjacent runs could
  // be merged into one copy), against the same 8 MiB as one copy; the best of 2 of each (~30 ms
  // per GPU pair at 4.5 us per run).
  constexpr size_t kRunBytes = 4096, kRuns = 2048, kSpan = 2 * kRunBytes * kRuns;
  const absl::Time t0 = absl::Now();
  std::vector<int> others = {device};
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  for (int d = 0; d < count; ++d) {
    if (d != device && cuda::EnablePeerAccess(device, d).ok()) others.push_back(d);
  }
  void* src = nullptr;
  KVRAIL_RETURN_IF_ERROR(
      cuda::CudaStatus(cudaMalloc(&src, kSpan), "cudaMalloc(copy-engine probe source)"));
  absl::Cleanup free_src = [src] { cudaFree(src); };
  KVRAIL_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create());
  KVRAIL_ASSIGN_OR_RETURN(cuda::Event stop, cuda::Event::Create());
  cudaStream_t stream = main_stream;
  // Seconds of the best of 2 runs of `enqueue` on the stream (after one untimed run).
  const auto best_of_2 =
      [&](const std::function<absl::Status()>& enqueue) -> absl::StatusOr<double> {
    float best = 0;
    for (int i = 0; i < 3; ++i) {
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventRecord(start.get(), stream), "cudaEventRecord"));
      KVRAIL_RETURN_IF_ERROR(enqueue());
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventRecord(stop.get(), stream), "cudaEventRecord"));
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventSynchronize(stop.get()), "copy-engine probe"));
      float ms = 0;
      cudaEventElapsedTime(&ms, start.get(), stop.get());
      if (i > 0 && (best == 0 || ms < best)) best = ms;
    }
    return best / 1e3;
  };
  std::vector<void*> dsts(kRuns);
  std::vector<const void*> srcs(kRuns);
  const std::vector<size_t> sizes(kRuns, kRunBytes);
  for (int other : others) {
    void* dst = nullptr;
    {
      cuda::ScopedDevice on(other);
      KVRAIL_RETURN_IF_ERROR(on.status());
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaMalloc(&dst, kSpan), "cudaMalloc(copy-engine probe destination)"));
    }
    absl::Cleanup free_dst = [dst, other] {
      cuda::ScopedDevice on(other);
      cudaFree(dst);
    };
    for (size_t i = 0; i < kRuns; ++i) {
      srcs[i] = static_cast<const uint8_t*>(src) + 2 * kRunBytes * i;
      dsts[i] = static_cast<uint8_t*>(dst) + 2 * kRunBytes * i;
    }
    const auto scattered_copy = [&] {
      return cuda::BatchCopy(dsts.data(), srcs.data(), sizes.data(), kRuns,
                             cudaMemcpyFlagPreferOverlapWithCompute, stream, "copy-engine probe");
    };
    const auto contiguous_copy = [&] {
      return cuda::CudaStatus(
          cudaMemcpyAsync(dst, src, kRunBytes * kRuns, cudaMemcpyDefault, stream),
          "copy-engine probe (contiguous)");
    };
    KVRAIL_ASSIGN_OR_RETURN(const double scattered, best_of_2(scattered_copy));
    KVRAIL_ASSIGN_OR_RETURN(const double contiguous, best_of_2(contiguous_copy));
    tuners.copy_costs().Set(device, other,
                            scheduler::CopyEngineSecondsPerRun(kRuns, scattered, contiguous));
  }
  const std::string measured = tuners.copy_costs().Describe();
  return absl::StrFormat(", %s measured in %.1f ms",
                         measured.empty() ? "no copy-engine cost" : measured,
                         absl::ToDoubleMilliseconds(absl::Now() - t0));
}

}  // namespace

absl::StatusOr<std::string> WarmUp(int device, const CudaEngineOptions& options, Tuners& tuners) {
  KVRAIL_ASSIGN_OR_RETURN(cuda::Stream own, cuda::Stream::Create(device));
  cudaStream_t stream = own.get();
  const absl::Time t0 = absl::Now();
  cudaMemPool_t pool = nullptr;
  KVRAIL_RETURN_IF_ERROR(
      cuda::CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool"));
  uint64_t keep = kRetainedPoolBytes;
  KVRAIL_RETURN_IF_ERROR(
      cuda::CudaStatus(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
                       "cudaMemPoolSetAttribute(release threshold)"));
  // Grows the pool once (plan buffers are small; 4 MiB covers a 262k + 262k-id plan).
  void* scratch = nullptr;
  KVRAIL_RETURN_IF_ERROR(
      cuda::CudaStatus(cudaMallocAsync(&scratch, 4 << 20, stream), "cudaMallocAsync(warm-up)"));
  KVRAIL_RETURN_IF_ERROR(
      cuda::CudaStatus(cudaFreeAsync(scratch, stream), "cudaFreeAsync(warm-up)"));
  KVRAIL_RETURN_IF_ERROR(kernels::WarmUpKvCopy(stream));
  // A failed seed costs only the first transfers' probes.
  absl::StatusOr<std::string> seeded = SeedTuners(options, tuners, stream);
  if (!seeded.ok()) {
    spdlog::warn("cuda:{} CTA tuners not seeded: {}", device, seeded.status().ToString());
  }
  // A failed measurement leaves the pairs at the one-GPU default cost.
  absl::StatusOr<std::string> costs = MeasureCopyEngineCosts(device, tuners, stream);
  if (!costs.ok()) {
    spdlog::warn("cuda:{} copy-engine cost not measured: {}", device, costs.status().ToString());
  }
  return absl::StrFormat("warmed up in %.1f ms%s%s; ", absl::ToDoubleMilliseconds(absl::Now() - t0),
                         seeded.ok() ? *seeded : std::string(),
                         costs.ok() ? *costs : std::string());
}

}  // namespace kvrail::engine::cuda_detail
