// DeviceWorker's batches: launch (kernel, copy engines, both), completion and the tuners' samples
// (see cuda_worker.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "daemon/engine/cuda/cuda_worker.h"

namespace kvrail::engine::cuda_detail {

absl::Status DeviceWorker::DigestBatch(JobState& s, uint32_t begin, uint32_t end, int ctas) {
  const int hash_ctas = ctas > 0 ? ctas : kDigestCtas;
  if (s.mode != Mode::kKernel) {
    KVRAIL_RETURN_IF_ERROR(kernels::LaunchKvDigest(s.plan->plan(), begin, end,
                                                   kernels::DigestKernelMode::kHashSource,
                                                   s.digests->source(), hash_ctas,
                                                   stream_.get(), kThreadsPerCta));
  }
  KVRAIL_RETURN_IF_ERROR(kernels::LaunchKvDigest(s.plan->plan(), begin, end,
                                                 kernels::DigestKernelMode::kHashDestination,
                                                 s.digests->destination(), hash_ctas,
                                                 stream_.get(), kThreadsPerCta));
  return s.digests->CopyBack(begin, end);
}

CtaTuner& DeviceWorker::TunerFor(int key, int max_ctas) {
  auto it = tuners_.find(key);
  if (it == tuners_.end()) {
    it = tuners_
             .emplace(key, CtaTuner(max_ctas, options_.fixed_ctas, options_.reprobe_batches))
             .first;
  }
  return it->second;
}

SplitTuner& DeviceWorker::SplitTunerFor(int key, double copy_gbps_prior) {
  auto it = split_tuners_.find(key);
  if (it == split_tuners_.end()) {
    it = split_tuners_
             .emplace(key, SplitTuner(options_.copy_split_max_percent / 100.0,
                                      options_.copy_split_fixed_percent / 100.0,
                                      copy_gbps_prior, options_.reprobe_batches))
             .first;
  }
  return it->second;
}

absl::StatusOr<cudaStream_t> DeviceWorker::CopyStream() {
  if (!copy_stream_.has_value()) {
    KVRAIL_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create(device_));
    copy_stream_.emplace(std::move(stream));
  }
  return copy_stream_->get();
}

Batch DeviceWorker::Launch(JobState& s, const Taken& taken) {
  if (first_job_text_pending_ && !s.gate.has_value() && s.setup.ok()) {
    // Best effort: without the anchor the first job's batches are not traced.
    absl::StatusOr<cuda::Event> anchor = TakeEvent();
    if (anchor.ok() && cudaEventRecord(anchor->get(), stream_.get()) == cudaSuccess) {
      s.trace_anchor = *std::move(anchor);
    }
  }
  Batch b = LaunchBatch(s, taken);
  if (s.trace_anchor.get() != nullptr && s.first_launch.has_value()) {
    b.enqueued_us = absl::ToDoubleMicroseconds(absl::Now() - *s.first_launch);
  }
  if (first_job_text_pending_) {
    // The daemon's first job after start: what its first batch waited for and cost here, so
    // a slow first transfer can be told apart from a slow engine.
    first_job_text_pending_ = false;
    const absl::Time now = absl::Now();
    std::string text = absl::StrFormat(
        "; first job: dispatcher took it %.0f us after its enqueue, set-up %.0f us (device "
        "addresses %.0f, mode %.0f, plan upload %.0f), first launch enqueued %.0f us after "
        "its set-up",
        absl::ToDoubleMicroseconds(taken.since_enqueue),
        absl::ToDoubleMicroseconds(s.setup_addresses + s.setup_mode + s.setup_upload),
        absl::ToDoubleMicroseconds(s.setup_addresses), absl::ToDoubleMicroseconds(s.setup_mode),
        absl::ToDoubleMicroseconds(s.setup_upload),
        absl::ToDoubleMicroseconds(now - first_launch_from_));
    absl::MutexLock lock(&mu_);
    first_job_text_ = std::move(text);
  }
  return b;
}

Batch DeviceWorker::LaunchBatch(JobState& s, const Taken& taken) {
  const int cls = taken.cls;
  const uint32_t begin = taken.begin, end = taken.end;
  Batch b;
  b.state = &s;
  b.taken = taken;
  b.split = end;
  ++s.in_flight;
  s.last_batch_bytes = taken.bytes;
  if (!s.first_launch.has_value()) s.first_launch = absl::Now();
  for (uint32_t t = begin; t < end; ++t) s.job->OnTileStart(t);
  if (!s.setup.ok()) {
    b.launch = s.setup;
    return b;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) {
      b.launch = broken_;
      return b;
    }
  }
  b.launch = [&]() -> absl::Status {
    // Ids the planner left unchecked: checked here, on the dispatcher, while the GPU runs the
    // batch before (a 64 MiB batch of 4 KiB blocks adds 16k ids per side). A failure fails
    // this batch and, sticky, every later one of the job; nothing of it reaches the GPU.
    KVRAIL_RETURN_IF_ERROR(s.job->plan().CheckTiles(begin, end));
    absl::Status released;
    if (s.gate.has_value() && s.gate_control->Aborted(&released)) {
      // Released before this layer was taken: nothing reaches the GPU.
      const uint32_t layer = s.job->plan().tile(begin).layer;
      return scheduler::GatedTileStatus(true, s.gate->field, layer, s.gate->value, released);
    }
    const cudaStream_t stream = s.gate.has_value() ? s.gate_stream : stream_.get();
    KVRAIL_ASSIGN_OR_RETURN(b.start, TakeEvent());
    KVRAIL_ASSIGN_OR_RETURN(b.stop, TakeEvent());
    if (s.gate.has_value()) {
      // The layers' words first (GEQ, wrapping epoch order): the kernel below starts when the
      // producer's stream has written them, without the CPU.
      const uint32_t first = s.job->plan().tile(begin).layer;
      const uint32_t last = s.job->plan().tile(end - 1).layer;
      for (uint32_t layer = first; layer <= last; ++layer) {
        const CUresult r = StreamWaitValue32()(
            reinterpret_cast<CUstream>(stream), s.gate->device_words + 4ull * layer,
            s.gate->value, CU_STREAM_WAIT_VALUE_GEQ);
        if (r != CUDA_SUCCESS) {
          return absl::InternalError(absl::StrCat(s.gate->field, "[", layer,
                                                  "]: cuStreamWaitValue32 failed: CUresult ", r));
        }
      }
      // The watchdog now looks at these words (a pending one may be released).
      uint32_t seen = s.gate_control->launched_end.load();
      while (seen < last + 1 &&
             !s.gate_control->launched_end.compare_exchange_weak(seen, last + 1)) {
      }
    }
    KVRAIL_RETURN_IF_ERROR(
        cuda::CudaStatus(cudaEventRecord(b.start.get(), stream), "cudaEventRecord"));
    if (s.mode == Mode::kKernel) {
      CtaTuner& ctas = TunerFor(s.tuner_key, s.max_ctas);
      scheduler::LaunchCtasInputs in;
      in.tuner_ctas = ctas.Next(taken.bytes);
      in.class_max_ctas = static_cast<int>(options_.limits[cls].max_ctas);
      in.critical = cls == static_cast<int>(PriorityClass::kCritical);
      in.critical_ctas = critical_ctas_;
      in.copy_only_kernel = s.copy_only_kernel;
      const scheduler::LaunchCtas chosen = scheduler::ChooseLaunchCtas(in);
      b.ctas = chosen.ctas;
      b.chosen = chosen;
      // The copy engines' share: not while the knee is being probed (its samples must be the
      // kernel's alone), else the SplitTuner's.
      if (s.may_split && !(ctas.probing() && taken.bytes >= CtaTuner::kMinSampleBytes)) {
        const double fraction =
            SplitTunerFor(s.tuner_key, s.copy_gbps_prior).Next(taken.bytes);
        b.split = scheduler::SplitPoint(s.job->plan(), begin, end, fraction);
        b.split_sampled = true;
      }
      if (s.digests) {  // the fused gather that also hashes the source (kv_digest.h)
        KVRAIL_RETURN_IF_ERROR(kernels::LaunchKvDigest(
            s.plan->plan(), begin, end, kernels::DigestKernelMode::kCopyHashSource,
            s.digests->source(), b.ctas, stream_.get(), kThreadsPerCta));
      } else {
        KVRAIL_RETURN_IF_ERROR(kernels::LaunchKvCopy(s.plan->plan(), begin, b.split, b.ctas,
                                                     stream, kThreadsPerCta));
      }
      if (b.split < end) {
        KVRAIL_RETURN_IF_ERROR(LaunchCopyPart(s, b));
        if (!s.split_said) {  // TransferStatus.engine: "cuda-kernel+cuda-copy-engine"
          s.job->OnEngineUsed(scheduler::ModeEngineName(Mode::kCopyEngine));
          s.split_said = true;
        }
      }
    } else {
      KVRAIL_RETURN_IF_ERROR(CopyEngine(s, begin, end));
    }
    if (s.digests) KVRAIL_RETURN_IF_ERROR(DigestBatch(s, begin, end, b.ctas));
    // A gated batch ends here too: no host function after it (the dispatcher polls its words
    // and then waits for this event), so the job's next layer follows on the GPU at once.
    return cuda::CudaStatus(cudaEventRecord(b.stop.get(), stream), "cudaEventRecord");
  }();
  return b;
}

absl::Status DeviceWorker::LaunchCopyPart(const JobState& s, Batch& b) {
  KVRAIL_ASSIGN_OR_RETURN(cudaStream_t copy, CopyStream());
  KVRAIL_ASSIGN_OR_RETURN(b.kernel_done, cuda::Event::Create());
  KVRAIL_ASSIGN_OR_RETURN(b.copy_done, cuda::Event::Create());
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaEventRecord(b.kernel_done.get(), stream_.get()),
                                          "cudaEventRecord(kernel part)"));
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamWaitEvent(copy, b.start.get(), 0),
                                          "cudaStreamWaitEvent(copy part)"));
  KVRAIL_RETURN_IF_ERROR(CopyEngine(s, b.split, b.taken.end, copy));
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaEventRecord(b.copy_done.get(), copy),
                                          "cudaEventRecord(copy part)"));
  return cuda::CudaStatus(cudaStreamWaitEvent(stream_.get(), b.copy_done.get(), 0),
                          "cudaStreamWaitEvent(join copy part)");
}

absl::Status DeviceWorker::CopyEngine(const JobState& s, uint32_t begin, uint32_t end,
                                      cudaStream_t stream) {
  runs_.clear();
  for (uint32_t t = begin; t < end; ++t) scheduler::AppendTileRuns(s.RunPlan(), t, &runs_);
  dsts_.resize(runs_.size());
  srcs_.resize(runs_.size());
  sizes_.resize(runs_.size());
  for (size_t i = 0; i < runs_.size(); ++i) {
    dsts_[i] = s.dst + runs_[i].dst;
    srcs_[i] = s.src + runs_[i].src;
    sizes_[i] = runs_[i].bytes;
  }
  return cuda::BatchCopy(dsts_.data(), srcs_.data(), sizes_.data(), runs_.size(),
                         cudaMemcpyFlagPreferOverlapWithCompute,
                         stream != nullptr ? stream : stream_.get(), "transfer batch");
}

absl::StatusOr<std::string> DeviceWorker::SeedTuners() {
  if (options_.max_ctas <= 0 || options_.fixed_ctas > 0) return std::string();
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
    CtaTuner& tuner = TunerFor(scheduler::CtaTunerKey(scheduler::MeanRunBytes(plan), true, true),
                               options_.max_ctas);
    // Pageable tables without staging: copied before Upload returns.
    KVRAIL_ASSIGN_OR_RETURN(
        kernels::DevicePlanBuffer buffer,
        kernels::DevicePlanBuffer::Upload(plan.header(), plan.src_blocks().data(),
                                          plan.dst_blocks().data(),
                                          reinterpret_cast<uint64_t>(scratch[0]),
                                          reinterpret_cast<uint64_t>(scratch[1]), stream_.get(),
                                          nullptr, 0));
    // The tuner's own probe, as a transfer's batches would run it (at most one per candidate).
    for (size_t i = 0; tuner.probing() && i < tuner.candidates().size(); ++i) {
      const int ctas = tuner.Next(plan.bytes_total());
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventRecord(start.get(), stream_.get()), "cudaEventRecord"));
      KVRAIL_RETURN_IF_ERROR(kernels::LaunchKvCopy(buffer.plan(), 0, plan.num_tiles(), ctas,
                                                   stream_.get(), kThreadsPerCta));
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventRecord(stop.get(), stream_.get()), "cudaEventRecord"));
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventSynchronize(stop.get()), "CTA tuner seed probe"));
      float ms = 0;
      cudaEventElapsedTime(&ms, start.get(), stop.get());
      tuner.Report(ctas, plan.bytes_total(), ms / 1e3);
      ++probes;
    }
    absl::StrAppend(&knees, knees.empty() ? "" : ", ", block >> 10, " KiB ", tuner.knee());
  }
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamSynchronize(stream_.get()),
                                          "CTA tuner seed (plan buffers freed)"));
  return absl::StrFormat(", CTA knees seeded in %.1f ms by %d probes on scratch blocks (%s)",
                         absl::ToDoubleMilliseconds(absl::Now() - t0), probes, knees);
}

absl::StatusOr<std::string> DeviceWorker::MeasureCopyEngineCosts() {
  // 2048 runs of 4 KiB, every other 4 KiB of a 16 MiB scratch on each side (adjacent runs could
  // be merged into one copy), against the same 8 MiB as one copy; the best of 2 of each (~30 ms
  // per GPU pair at 4.5 us per run).
  constexpr size_t kRunBytes = 4096, kRuns = 2048, kSpan = 2 * kRunBytes * kRuns;
  const absl::Time t0 = absl::Now();
  std::vector<int> others = {device_};
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  for (int d = 0; d < count; ++d) {
    if (d != device_ && cuda::EnablePeerAccess(device_, d).ok()) others.push_back(d);
  }
  void* src = nullptr;
  KVRAIL_RETURN_IF_ERROR(
      cuda::CudaStatus(cudaMalloc(&src, kSpan), "cudaMalloc(copy-engine probe source)"));
  absl::Cleanup free_src = [src] { cudaFree(src); };
  KVRAIL_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create());
  KVRAIL_ASSIGN_OR_RETURN(cuda::Event stop, cuda::Event::Create());
  cudaStream_t stream = stream_.get();
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
    copy_costs_.Set(device_, other,
                    scheduler::CopyEngineSecondsPerRun(kRuns, scattered, contiguous));
  }
  const std::string measured = copy_costs_.Describe();
  return absl::StrFormat(", %s measured in %.1f ms",
                         measured.empty() ? "no copy-engine cost" : measured,
                         absl::ToDoubleMilliseconds(absl::Now() - t0));
}

void DeviceWorker::Complete(Batch& b) {
  JobState& s = *b.state;
  absl::Status status = b.launch;
  float ms = 0;
  if (status.ok()) {
    const cudaError_t e = cudaEventSynchronize(b.stop.get());
    status = cuda::CudaStatus(e, "transfer batch");
    if (cuda::IsStickyError(e)) {
      // The daemon's context on this GPU is gone for good: fail everything after this clearly
      // instead of with a cascade of unrelated runtime errors.
      absl::MutexLock lock(&mu_);
      if (broken_.ok()) {
        broken_ = absl::FailedPreconditionError(absl::StrCat(
            "GPU", device_, " is unusable in this kvraild after an earlier kernel fault (",
            cudaGetErrorName(e), "); restart kvraild to use it again"));
      }
    }
  }
  // The tiles are reported first: the transfer's end (and its DONE to the client) does not wait
  // for the tuners and the stats line below (they are off the critical path).
  --s.in_flight;
  for (uint32_t t = b.taken.begin; t < b.taken.end; ++t) {
    absl::Status tile_status = status;
    absl::Status released;
    if (s.gate.has_value() && s.gate_control->Aborted(&released)) {
      // Its kernel ran empty (or it never launched).
      tile_status = scheduler::GatedTileStatus(true, s.gate->field, s.job->plan().tile(t).layer,
                                               s.gate->value, released);
    }
    if (status.ok() && s.digests) {  // spec.digest: the mirror holds this batch's digests
      const uint64_t from = s.digests->host_source(t), to = s.digests->host_destination(t);
      s.job->OnTileDigest(t, from, to);
      if (from != to) tile_status = planner::DigestMismatchError(s.job->plan(), t, from, to);
    }
    s.job->OnTileDone(t, tile_status);
  }
  if (status.ok()) cudaEventElapsedTime(&ms, b.start.get(), b.stop.get());
  if (status.ok()) {
    const double seconds = ms / 1e3;
    const double gbps =
        seconds > 0 ? static_cast<double>(b.taken.bytes) / seconds / 1e9 : 0;
    std::string decision;
    if (b.ctas > 0) {
      CtaTuner& tuner = TunerFor(s.tuner_key, s.max_ctas);
      // The kernel's own part: with a split, its bytes over its own time.
      uint64_t kernel_bytes = b.taken.bytes;
      double kernel_seconds = seconds;
      scheduler::SplitSample split;
      if (b.split < b.taken.end) {
        kernel_bytes = 0;
        for (uint32_t t = b.taken.begin; t < b.split; ++t) {
          kernel_bytes += s.job->plan().tile(t).bytes;
        }
        float kernel_ms = 0, copy_ms = 0;
        cudaEventElapsedTime(&kernel_ms, b.start.get(), b.kernel_done.get());
        cudaEventElapsedTime(&copy_ms, b.start.get(), b.copy_done.get());
        kernel_seconds = kernel_ms / 1e3;
        split.copy_bytes = b.taken.bytes - kernel_bytes;
        split.copy_seconds = copy_ms / 1e3;
      }
      split.kernel_bytes = kernel_bytes;
      split.kernel_seconds = kernel_seconds;
      split.total_seconds = seconds;
      // Only the tuner's own choices teach it (not a class cap, a critical raise or the ramp).
      const bool sample = b.chosen.tuner_sample() && !b.taken.ramped;
      if (sample) tuner.Report(b.ctas, kernel_bytes, kernel_seconds);
      decision = absl::StrFormat("kernel %d CTAs%s%s, now %s", b.ctas,
                                 b.chosen.raised ? " (critical)" : "",
                                 b.chosen.capped ? " (class limit)" : "", tuner.Describe());
      if (s.may_split) {
        SplitTuner& splits = SplitTunerFor(s.tuner_key, s.copy_gbps_prior);
        if (b.split_sampled && sample) splits.Report(split);
        if (b.split < b.taken.end) {
          absl::StrAppendFormat(&decision, " beside the copy engines (%.0f%% of this batch)",
                                100.0 * static_cast<double>(split.copy_bytes) /
                                    static_cast<double>(b.taken.bytes));
        }
        absl::StrAppend(&decision, "; ", splits.Describe());
      }
    } else {
      decision = "copy engine";
    }
    s.gpu_seconds += seconds;
    s.bytes_done += b.taken.bytes;
    ++s.batches;
    // The first job's trace: its first kFirstJobTraceBatches batches (a long first job would
    // otherwise grow the stats line, and its copy under mu_, with every batch).
    bool traced = false;
    if (s.trace_anchor.get() != nullptr && b.enqueued_us >= 0 &&
        s.batches <= kFirstJobTraceBatches + 1) {
      if (s.batches <= kFirstJobTraceBatches) {
        float start_ms = 0, stop_ms = 0;
        cudaEventElapsedTime(&start_ms, s.trace_anchor.get(), b.start.get());
        cudaEventElapsedTime(&stop_ms, s.trace_anchor.get(), b.stop.get());
        absl::StrAppendFormat(&s.trace, "%s%.0f/%.0f/%.0f", s.trace.empty() ? "" : ", ",
                              b.enqueued_us, start_ms * 1e3, stop_ms * 1e3);
      } else {
        absl::StrAppend(&s.trace, ", ...");
      }
      traced = true;
    }
    absl::MutexLock lock(&mu_);
    if (traced) first_job_batches_ = s.trace;
    (b.ctas > 0 ? kernel_batches_ : copy_batches_)++;
    if (b.split < b.taken.end) ++split_batches_;
    last_decision_ = absl::StrFormat("%s, %.1f GB/s last batch (%.1f MiB)", decision, gbps,
                                     static_cast<double>(b.taken.bytes) / (1 << 20));
    last_job_ = JobSample{s.batches, s.bytes_done, s.gpu_seconds,
                          absl::ToDoubleSeconds(absl::Now() - *s.first_launch)};
  }
  {
    absl::MutexLock lock(&mu_);
    inflight_bytes_[b.taken.cls] -= b.taken.bytes;  // after the report, as in the host engine
  }
  // Passed and read: reusable (not after an error, which may have left them unusable).
  for (cuda::Event* e : {&b.start, &b.stop}) {
    if (status.ok() && e->get() != nullptr && spare_events_.size() < 8) {
      spare_events_.push_back(std::move(*e));
    }
  }
}

absl::StatusOr<cuda::Event> DeviceWorker::TakeEvent() {
  if (spare_events_.empty()) return cuda::Event::Create();
  cuda::Event e = std::move(spare_events_.back());
  spare_events_.pop_back();
  return e;
}

}  // namespace kvrail::engine::cuda_detail
