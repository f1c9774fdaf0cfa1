// DeviceWorker's GPU-side readiness wait: admission, arming a job's abort stream, completing gated
// batches, and the watchdog that releases waits with CPU stores (see cuda_worker.h).
#include "daemon/engine/cuda/cuda_worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"

namespace kvrail::engine::cuda_detail {

WaitValue32Fn StreamWaitValue32() {
  static const auto fn =
      reinterpret_cast<WaitValue32Fn>(cuda::DriverEntryPoint("cuStreamWaitValue32"));
  return fn;
}

WriteValue32Fn StreamWriteValue32() {
  static const auto fn =
      reinterpret_cast<WriteValue32Fn>(cuda::DriverEntryPoint("cuStreamWriteValue32"));
  return fn;
}

bool DeviceWorker::AdmitGated(const std::shared_ptr<Job>& job) {
  if (!options_.stream_wait) {
    // Before ready_gate: that would pin the flag region for the GPU, for nothing.
    job->OnEngineNote(scheduler::ChooseGate(scheduler::GateInputs{}).reason);
    return false;
  }
  std::optional<Job::ReadyGate> gate = job->ready_gate(device_);
  if (!gate.has_value()) return false;
  scheduler::GateInputs in;
  {
    absl::MutexLock lock(&mu_);  // the abort page is made before serving starts
    in.enabled = true;
    in.ready = abort_device_ != 0 && StreamWriteValue32() != nullptr;
  }
  in.flags_mapped = gate->device_words != 0 && gate->host_words != nullptr &&
                    gate->count >= job->plan().num_layers() && StreamWaitValue32() != nullptr;
  in.kernel_mode = scheduler::ChoosePlanMode(ModeInputsFor(*job, false)).mode == Mode::kKernel;
  in.digest = job->wants_digest();
  scheduler::GateChoice choice;
  {
    absl::MutexLock lock(&mu_);
    choice = gate_slots_.Admit(job.get(), in);
    last_gate_choice_ = choice.reason;
    if (choice.stream_wait) admitted_gates_[job.get()] = AdmittedGate{job, std::move(*gate)};
  }
  // The transfer's path_reason says how its layers wait (the set-up notes the GPU wait).
  if (!choice.stream_wait) job->OnEngineNote(choice.reason);
  return choice.stream_wait;
}

std::string DeviceWorker::GateTextLocked() const {
  if (!options_.stream_wait) return "";
  return absl::StrCat("; stream wait: ", gate_slots_.held(), " of ", gate_queues_.max_jobs,
                      " jobs waiting on the GPU",
                      gate_queues_.reason.empty() ? std::string()
                                                  : absl::StrCat(" (", gate_queues_.reason, ")"),
                      ", ", gate_releases_,
                      " released by the daemon (", gate_bound_releases_,
                      " for a call blocked behind a wait, bound ",
                      options_.stream_wait_sync_bound_ms, " ms); last choice: ",
                      last_gate_choice_.empty() ? "none" : last_gate_choice_);
}

absl::Status DeviceWorker::MakeGateStreams() {
  // The copy-engine part's stream first (made lazily otherwise, after the pool).
  KVRAIL_RETURN_IF_ERROR(CopyStream().status());
  std::vector<GateStreams> pool;
  for (int i = 0; i < gate_queues_.max_jobs; ++i) {
    KVRAIL_ASSIGN_OR_RETURN(cuda::Stream copy, cuda::Stream::Create(device_));
    KVRAIL_ASSIGN_OR_RETURN(cuda::Stream abort, cuda::Stream::Create(device_));
    pool.push_back(GateStreams{std::move(copy), std::move(abort)});
  }
  gate_pool_ = std::move(pool);
  for (int i = 0; i < static_cast<int>(gate_pool_.size()); ++i) free_gate_streams_.push_back(i);
  if (!gate_queues_.reason.empty()) {
    spdlog::warn("cuda:{} GPU stream wait for at most {} jobs at once: {}", device_,
                 gate_queues_.max_jobs, gate_queues_.reason);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> DeviceWorker::TakeGateStreams(const std::string& field) {
  if (free_gate_streams_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ": no stream pair free on GPU", device_, " for the GPU stream wait (",
        gate_pool_.size(), " made at start)"));
  }
  const int pair = free_gate_streams_.front();
  free_gate_streams_.pop_front();
  return pair;
}

void DeviceWorker::PollGated() {
  std::vector<JobState*> drained;
  for (auto& entry : states_) {
    JobState& s = *entry.second;
    if (!s.gate.has_value() || s.gated.empty()) continue;
    while (!s.gated.empty()) {
      Batch& b = s.gated.front();
      // Not passed yet: completed now (Complete waits for its event) only once its words
      // have come (or were raised by a release), so the wait is the kernel's, never the
      // producer's.
      if (b.launch.ok() && cudaEventQuery(b.stop.get()) == cudaErrorNotReady &&
          !GateWordsCame(s, b)) {
        break;
      }
      Complete(b);
      s.gated.pop_front();
      --gated_pending_;
    }
    if (s.gated.empty()) drained.push_back(&s);
  }
  for (JobState* s : drained) {
    std::unique_ptr<JobState> finished;
    absl::MutexLock lock(&mu_);
    finished = TakeIfFinishedLocked(s);
  }
}

bool DeviceWorker::GateWordsCame(const JobState& s, const Batch& b) const {
  const uint32_t first = s.job->plan().tile(b.taken.begin).layer;
  const uint32_t last = s.job->plan().tile(b.taken.end - 1).layer;
  for (uint32_t l = first; l <= last && l < s.gate->count; ++l) {
    if (!Reached(__atomic_load_n(&s.gate->host_words[l], __ATOMIC_ACQUIRE), s.gate->value)) {
      return false;
    }
  }
  return true;
}

absl::Status DeviceWorker::MakeAbortPage() {
  void* page = nullptr;
  cudaError_t e;
  {
    cuda::ContextSyncScope sync("cudaHostAlloc(abort page)");
    e = cudaHostAlloc(&page, 8 * kGateWordPairs, cudaHostAllocMapped | cudaHostAllocPortable);
  }
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(e, "cudaHostAlloc(abort page)"));
  std::memset(page, 0, 8 * kGateWordPairs);
  void* device = nullptr;
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaHostGetDevicePointer(&device, page, 0),
                                          "cudaHostGetDevicePointer(abort page)"));
  for (int i = 0; i < kGateWordPairs; ++i) free_abort_slots_.push_back(i);
  absl::MutexLock lock(&mu_);
  abort_host_ = static_cast<uint32_t*>(page);  // kept for the process's life
  abort_device_ = reinterpret_cast<uint64_t>(device);
  return absl::OkStatus();
}

void DeviceWorker::Watch() {
  while (true) {
    std::vector<std::shared_ptr<GateControl>> controls;
    {
      absl::MutexLock lock(&watch_mu_);
      watch_mu_.AwaitWithTimeout(absl::Condition(&watch_stop_), kGateWatchTick);
      if (watch_stop_) return;
      controls = controls_;
    }
    if (controls.empty()) continue;
    const absl::Time now = absl::Now();
    const std::optional<cuda::OpenContextSync> sync = cuda::OldestContextSync();
    const absl::Duration silent =
        now - absl::FromUnixNanos(beat_ns_.load(std::memory_order_relaxed));
    for (const auto& c : controls) WatchOne(*c, now, sync, silent);
  }
}

void DeviceWorker::WatchOne(GateControl& c, absl::Time now,
                            const std::optional<cuda::OpenContextSync>& sync,
                            absl::Duration silent) {
  {
    absl::MutexLock lock(&c.mu);
    if (c.released) return;
  }
  scheduler::GateWatchInputs in;
  absl::Status ended;
  if (gates_stopping_.load()) {
    ended = absl::UnavailableError("the daemon's CUDA engine stopped");
    in.producer_gone = true;
  } else {
    std::shared_ptr<Job> job = c.job.lock();
    if (job == nullptr) return;
    bool gone = false;
    ended = job->ended(&gone);
    in.producer_gone = gone;
  }
  in.ended = !ended.ok();
  if (in.ended) {
    absl::MutexLock lock(&c.mu);
    if (!c.ended_seen.has_value()) c.ended_seen = now;
    in.since_end = now - *c.ended_seen;
  }
  in.grace = kGateReleaseGrace;
  const uint32_t launched = std::min(c.launched_end.load(), c.gate.count);
  for (uint32_t i = 0; i < launched && !in.waits_pending; ++i) {
    in.waits_pending = !Reached(__atomic_load_n(&c.gate.host_words[i], __ATOMIC_ACQUIRE),
                                c.gate.value);
  }
  if (sync.has_value()) {
    in.sync_blocked_for = now - sync->since;
    in.sync_what = sync->what;
  }
  in.dispatcher_silent_for = silent;
  in.bound = absl::Milliseconds(options_.stream_wait_sync_bound_ms);
  const scheduler::GateReleaseDecision decision = scheduler::DecideGateRelease(in);
  if (!decision.release()) return;
  const absl::Status why =
      decision.cause == scheduler::GateReleaseCause::kEnded ? ended : decision.why;
  uint32_t raised = 0;
  if (!ReleaseGate(c, why, &raised)) return;  // the disarm did not show yet: next tick
  absl::MutexLock lock(&mu_);
  ++gate_releases_;
  if (decision.cause != scheduler::GateReleaseCause::kEnded) ++gate_bound_releases_;
  spdlog::warn("cuda:{} a gated job's waits released by the daemon ({} of its {} ready words "
               "({}) raised): {}",
               device_, raised, c.gate.count, c.gate.field, why.ToString());
}

bool DeviceWorker::ReleaseGate(GateControl& c, const absl::Status& why, uint32_t* raised) {
  absl::MutexLock lock(&c.mu);
  if (c.released) return true;
  if (!c.aborted) {
    c.aborted = true;
    c.end = why;
  }
  if (c.armed.load(std::memory_order_acquire)) {
    c.FireLocked();
    const absl::Time until = absl::Now() + kGateDisarmWait;
    while (!Reached(__atomic_load_n(c.done_word, __ATOMIC_ACQUIRE), c.epoch)) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Microseconds(20));
    }
    for (uint32_t i = 0; i < c.gate.count; ++i) {
      uint32_t* word = &c.gate.host_words[i];
      uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      while (std::optional<uint32_t> store = scheduler::ReleaseStore(seen, c.gate.value)) {
        if (__atomic_compare_exchange_n(word, &seen, *store, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
          ++*raised;
          break;
        }
      }
    }
  }
  // Not armed: its set-up has not finished, so nothing of it waits on the GPU (and Launch sees
  // `aborted` before it enqueues a wait).
  c.released = true;
  return true;
}

void DeviceWorker::RetireGate(JobState& s) {
  // The stream pair goes back first (a set-up that failed before arming holds one too); its
  // streams are idle or pass at once: every gated batch of the job completed, and the abort
  // stream's wait passes at the abort word stored below (or at arming's failure).
  if (s.gate_streams >= 0) {
    free_gate_streams_.push_back(s.gate_streams);
    s.gate_streams = -1;
  }
  if (s.gate_control == nullptr) return;
  GateControl& c = *s.gate_control;
  {
    absl::MutexLock lock(&c.mu);
    c.FireLocked();
  }
  if (s.gate_abort_done.get() != nullptr) {
    (void)cudaStreamWaitEvent(stream_.get(), s.gate_abort_done.get(), 0);
  }
  {
    absl::MutexLock lock(&watch_mu_);
    controls_.erase(std::remove(controls_.begin(), controls_.end(), s.gate_control),
                    controls_.end());
  }
  if (c.slot >= 0) free_abort_slots_.push_back(c.slot);
  s.gate_control.reset();
}

absl::Status DeviceWorker::ArmGate(JobState& s, const Job::ReadyGate& gate) {
  if (free_abort_slots_.empty() || !s.plan.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        gate.field, ": no abort word free on GPU", device_, " for the GPU stream wait"));
  }
  auto c = std::make_shared<GateControl>();
  c->job = s.job;
  c->gate = gate;
  c->slot = free_abort_slots_.front();
  free_abort_slots_.pop_front();
  c->epoch = ++gate_epoch_;
  if (c->epoch == 0) c->epoch = ++gate_epoch_;
  uint64_t abort_device = 0;
  {
    absl::MutexLock lock(&mu_);
    c->abort_word = abort_host_ + 2 * c->slot;
    abort_device = abort_device_ + 8ull * c->slot;
  }
  c->done_word = c->abort_word + 1;
  s.gate_control = c;  // the slot goes back with it (RetireGate), armed or not
  const cudaStream_t abort_stream = gate_pool_[s.gate_streams].abort.get();
  s.gate_abort_stream = abort_stream;
  KVRAIL_ASSIGN_OR_RETURN(s.gate_abort_done, cuda::Event::Create());
  const CUstream as = reinterpret_cast<CUstream>(abort_stream);
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(
      cudaStreamWaitEvent(abort_stream, s.gate_uploaded.get(), 0),
      "cudaStreamWaitEvent(gate abort stream)"));
  const CUresult r = StreamWaitValue32()(as, abort_device, c->epoch, CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat(gate.field, ": arming the abort stream on GPU",
                                            device_, ": cuStreamWaitValue32 failed: CUresult ", r));
  }
  // From here on the abort stream waits: any failure below lets it pass at once (its header
  // zeroing is harmless for a job whose set-up failed: none of its kernels runs).
  absl::Status armed = [&]() -> absl::Status {
    auto* header = reinterpret_cast<uint8_t*>(
        const_cast<kernels::PlanHeader*>(s.plan->plan().header));
    KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(
        cudaMemsetAsync(header + offsetof(kernels::PlanHeader, num_tiles), 0, sizeof(uint32_t),
                        abort_stream),
        "cudaMemsetAsync(gate abort: num_tiles)"));
    const CUresult w =
        StreamWriteValue32()(as, abort_device + 4, c->epoch, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (w != CUDA_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("cuStreamWriteValue32(gate abort: done word) failed: CUresult ", w));
    }
    return cuda::CudaStatus(cudaEventRecord(s.gate_abort_done.get(), abort_stream),
                            "cudaEventRecord(gate abort)");
  }();
  if (!armed.ok()) {
    __atomic_store_n(c->abort_word, c->epoch, __ATOMIC_RELEASE);
    return absl::Status(armed.code(), absl::StrCat(gate.field, ": arming the abort stream on GPU",
                                                   device_, ": ", armed.message()));
  }
  c->armed.store(true, std::memory_order_release);
  absl::MutexLock lock(&watch_mu_);
  controls_.push_back(std::move(c));
  return absl::OkStatus();
}

}  // namespace kvrail::engine::cuda_detail
