// DeviceWorker: queues, the dispatch loop, job set-up, plan staging (see cuda_worker.h).
#include "daemon/engine/cuda/cuda_worker.h"

#include <sys/prctl.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "kernels/plan_image.h"

namespace kvrail::engine::cuda_detail {

namespace {

// The GPU's SM count (0 when the runtime cannot say: then no critical raise).
int SmCount(int device) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return sms;
}

}  // namespace

DeviceWorker::DeviceWorker(int device, const CudaEngineOptions& options, cuda::Stream stream)
    : device_(device),
      options_(options),
      critical_ctas_(scheduler::ResolveCriticalCtas(options.critical_ctas, SmCount(device),
                                                    options.max_ctas)),
      stream_(std::move(stream)) {
  Beat();
  thread_ = std::thread([this] { Run(); });
  if (options_.stream_wait) watchdog_ = std::thread([this] { Watch(); });
}

DeviceWorker::~DeviceWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  if (staging_memory_ != nullptr) cudaFreeHost(staging_memory_);
  {
    absl::MutexLock lock(&watch_mu_);
    watch_stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
}

std::string DeviceWorker::Describe() const {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return absl::StrCat("cuda:", device_, " BROKEN: ", broken_.message());
  return absl::StrCat("cuda:", device_, " ", warm_up_text_, last_decision_, ", budget ",
                      options_.max_ctas, " CTAs",
                      critical_ctas_ > 0
                          ? absl::StrCat(" (critical transfers ", critical_ctas_, ")")
                          : std::string(),
                      "; ", kernel_batches_, " kernel / ", copy_batches_,
                      " copy-engine batches",
                      split_batches_ > 0 ? absl::StrCat(" (", split_batches_,
                                                        " kernel batches split with the copy "
                                                        "engines)")
                                         : std::string(),
                      "; ", CopyOnlyTextLocked(), held_states_,
                      " jobs set up (plan on the GPU); last job set-up (plan upload enqueued) ",
                      SetUpTextLocked(), LastJobTextLocked(), first_job_text_,
                      first_job_batches_.empty()
                          ? std::string()
                          : absl::StrCat("; first job's batches (us: launch enqueued after "
                                         "the first launch's / GPU start / GPU end after the "
                                         "GPU reached the first launch): ",
                                         first_job_batches_),
                      GateTextLocked());
}

std::string DeviceWorker::CopyOnlyTextLocked() const {
  if (copy_only_kernel_plans_ == 0 && slow_copy_plans_ == 0) return "";
  return absl::StrCat(copy_only_kernel_plans_, " tiny-run plans on a small kernel / ",
                      slow_copy_plans_, " slow plans kept on the copy engines (latest: ",
                      last_mode_note_, "); ");
}

std::string DeviceWorker::SetUpTextLocked() const {
  if (!last_setup_.has_value()) return "none yet";
  return absl::StrFormat("%.0f us (%.1f MiB of block tables, %s)",
                         absl::ToDoubleMicroseconds(last_setup_->took),
                         last_setup_->table_bytes / 1048576.0,
                         last_setup_->pinned ? "pinned" : "pageable");
}

std::string DeviceWorker::LastJobTextLocked() const {
  if (!last_job_.has_value()) return "";
  const JobSample& j = *last_job_;
  return absl::StrFormat(
      "; last job so far: %u batches, GPU busy %.3f of %.3f ms since its first launch "
      "(%.1f GB/s while busy)",
      j.batches, j.gpu_seconds * 1e3, j.wall_seconds * 1e3,
      j.gpu_seconds > 0 ? j.bytes / j.gpu_seconds / 1e9 : 0.0);
}

std::optional<Taken> DeviceWorker::TakeLocked() {
  for (int c = 0; c < kNumPriorityClasses; ++c) {
    if (queues_.Empty(c)) continue;
    const ClassLimits& limit = options_.limits[c];
    if (!MayStart(limit, inflight_bytes_[c], queues_.FrontTileBytes(c))) continue;
    const uint64_t budget = scheduler::ClassBatchBytes(
        scheduler::BatchBytesFor(c == static_cast<int>(PriorityClass::kBackground),
                                     options_.batch_bytes),
        limit.max_inflight_bytes,
        inflight_bytes_[c]);
    // Read inside the callback below, which runs under mu_ (held here).
    const auto* gated = &admitted_gates_;
    auto [job, batch] = queues_.TakeFrom(c, [&](const Job& j, scheduler::TileRanges& tiles) {
      const auto state = states_.find(&j);
      const uint64_t previous = state == states_.end() ? 0 : state->second->last_batch_bytes;
      if (gated->count(&j) > 0) {  // one layer per batch: each waits on its own word
        return scheduler::TakeJobBatch(
            &tiles, j.plan(), std::min(budget, LayerBytesFrom(j.plan(), tiles.front())),
            previous);
      }
      return scheduler::TakeJobBatch(&tiles, j.plan(), budget, previous);
    });
    Taken taken{std::move(job), c, batch.begin, batch.end, 0, batch.ramped,
                absl::Now() - last_enqueue_};
    for (uint32_t t = taken.begin; t < taken.end; ++t) {
      taken.bytes += taken.job->plan().tile(t).bytes;
    }
    inflight_bytes_[c] += taken.bytes;
    return taken;
  }
  return std::nullopt;
}

absl::Status DeviceWorker::WarmUp() {
  const absl::Time t0 = absl::Now();
  cudaMemPool_t pool = nullptr;
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device_),
                                          "cudaDeviceGetDefaultMemPool"));
  uint64_t keep = kRetainedPoolBytes;
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
      "cudaMemPoolSetAttribute(release threshold)"));
  // Grows the pool once (plan buffers are small; 4 MiB covers a 262k + 262k-id plan).
  void* scratch = nullptr;
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaMallocAsync(&scratch, 4 << 20, stream_.get()),
                                          "cudaMallocAsync(warm-up)"));
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaFreeAsync(scratch, stream_.get()),
                                          "cudaFreeAsync(warm-up)"));
  KVRAIL_RETURN_IF_ERROR(kernels::WarmUpKvCopy(stream_.get()));
  // A failed seed costs only the first transfers' probes.
  absl::StatusOr<std::string> seeded = SeedTuners();
  if (!seeded.ok()) {
    spdlog::warn("cuda:{} CTA tuners not seeded: {}", device_, seeded.status().ToString());
  }
  // A failed measurement leaves the pairs at the one-GPU default cost.
  absl::StatusOr<std::string> costs = MeasureCopyEngineCosts();
  if (!costs.ok()) {
    spdlog::warn("cuda:{} copy-engine cost not measured: {}", device_, costs.status().ToString());
  }
  absl::MutexLock lock(&mu_);
  warm_up_text_ =
      absl::StrFormat("warmed up in %.1f ms%s%s; ", absl::ToDoubleMilliseconds(absl::Now() - t0),
                      seeded.ok() ? *seeded : std::string(), costs.ok() ? *costs : std::string());
  return absl::OkStatus();
}

void DeviceWorker::Run() {
  // Binds this thread to its GPU for good: every event and launch below goes there. Code that
  // visits another GPU from this thread (closing another GPU's mapping, enabling peer access)
  // does so under a cuda::ScopedDevice, which gives the thread back its GPU.
  absl::Status bound = cuda::SetDevice(device_);
  if (bound.ok() && options_.stream_wait) {
    // The 20 us looks at gated words (kGateWordPoll) must not stretch to the default 50 us
    // timer slack (as the readiness poller, daemon/readiness).
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    // Made before serving: the streams in their order (each parked wait on a hardware queue of
    // its own), and the abort page (cudaHostAlloc may synchronize the context, which must not
    // happen while a gated job's wait is pending). Without either, no stream wait.
    absl::Status page = MakeGateStreams();
    if (page.ok()) page = MakeAbortPage();
    if (!page.ok()) {
      spdlog::warn("cuda:{} no GPU stream wait (gated layers use the readiness poller): {}",
                   device_, page.ToString());
    }
  }
  if (bound.ok() && options_.staged_plan_upload) {
    // Made before serving (cudaHostAlloc may synchronize the context). Without it plans upload
    // unstaged: only speed is lost.
    if (absl::Status made = MakeStaging(); !made.ok()) {
      spdlog::warn("cuda:{} plan uploads unstaged: {}", device_, made.ToString());
    }
  }
  if (bound.ok() && options_.warm_up) {
    // A failed warm-up costs only speed: the first transfer pays what it would have.
    if (absl::Status warm = WarmUp(); !warm.ok()) {
      spdlog::warn("cuda:{} warm-up failed: {}", device_, warm.ToString());
    }
  }
  {
    absl::MutexLock lock(&mu_);
    warm_done_ = true;
  }
  std::deque<Batch> in_flight;
  while (true) {
    Beat();
    if (in_flight.empty() && gated_pending_ == 0 && options_.dispatcher_spin_us > 0) {
      SpinForWork();
    }
    std::optional<Taken> next;
    {
      absl::MutexLock lock(&mu_);
      if (in_flight.empty()) {
        SweepLocked();
        if (gated_pending_ == 0) {
          mu_.Await(absl::Condition(this, &DeviceWorker::HasWorkOrStop));
        } else {
          // Gated batches complete on their own streams: every kGateWordPoll the dispatcher
          // looks whether a producer's word has come (PollGated).
          mu_.AwaitWithTimeout(absl::Condition(this, &DeviceWorker::HasWorkOrStop),
                               kGateWordPoll);
        }
        expect_ = false;  // woken for it: the spin at the loop's top waits for its Enqueue
        if (stop_) break;
      }
      if (in_flight.size() < kMaxInFlight) next = TakeLocked();
    }
    if (next.has_value()) {
      JobState& state = StateFor(next->job, bound);
      Batch b = Launch(state, *next);
      if (state.gate.has_value()) {
        state.gated.push_back(std::move(b));
        ++gated_pending_;
      } else {
        in_flight.push_back(std::move(b));
      }
    }
    if (gated_pending_ > 0) PollGated();
    if (!in_flight.empty() && (!next.has_value() || in_flight.size() >= kMaxInFlight)) {
      JobState* done = in_flight.front().state;
      Complete(in_flight.front());
      in_flight.pop_front();
      // A job that has ended gives back its plan buffer and pinned tables now, not when the
      // GPU next goes idle: under steady load that may be never, and every new plan would
      // pin fresh table memory.
      std::unique_ptr<JobState> finished;
      {
        absl::MutexLock lock(&mu_);
        finished = TakeIfFinishedLocked(done);
      }
      // Freed here, outside the lock (stream-ordered frees, no device synchronization).
    }
  }
  // Stopping with gated copies still waiting (their jobs not ended, e.g. the engine destroyed
  // without a drain): they are aborted and released as for a gone producer, so no stream of
  // the daemon stays blocked on a word nobody will write; bounded.
  // The gate watchdog does the releasing (gates_stopping_: as for a gone producer).
  gates_stopping_.store(true);
  const absl::Time give_up = absl::Now() + absl::Seconds(2);
  while (gated_pending_ > 0 && absl::Now() < give_up) {
    Beat();
    PollGated();
    if (gated_pending_ > 0) absl::SleepFor(absl::Microseconds(100));
  }
  // No abort stream stays blocked on its word once the engine is gone.
  for (auto& entry : states_) RetireGate(*entry.second);
}

void DeviceWorker::SweepLocked() {
  for (auto it = admitted_gates_.begin(); it != admitted_gates_.end();) {
    if (it->second.job.expired()) {  // admitted, never started (its transfer ended first)
      gate_slots_.Release(it->first);
      it = admitted_gates_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = states_.begin(); it != states_.end();) {
    if (Finished(*it->second)) {
      ForgetGateLocked(it->first);
      RetireGate(*it->second);
      it = states_.erase(it);
    } else {
      ++it;
    }
  }
  held_states_ = states_.size();
}

std::unique_ptr<JobState> DeviceWorker::TakeIfFinishedLocked(JobState* s) {
  std::unique_ptr<JobState> out;
  if (Finished(*s)) {
    ForgetGateLocked(s->job.get());
    RetireGate(*s);
    auto it = states_.find(s->job.get());
    out = std::move(it->second);
    states_.erase(it);
  }
  held_states_ = states_.size();
  return out;
}

scheduler::ModeInputs DeviceWorker::ModeInputsFor(const Job& job, bool peer_unreachable) const {
  scheduler::ModeInputs in;
  in.max_ctas = options_.max_ctas;
  in.mean_run_bytes = scheduler::MeanRunBytes(job.plan());
  in.copy_engine_min_run = options_.copy_engine_min_run_bytes;
  in.peer_unreachable = peer_unreachable;
  in.copy_only_kernel_ctas = options_.copy_only_kernel_ctas;
  in.copy_only_kernel_below_run = options_.copy_only_kernel_below_run_bytes;
  return in;
}

JobState& DeviceWorker::StateFor(const std::shared_ptr<Job>& job, const absl::Status& bound) {
  auto it = states_.find(job.get());
  if (it != states_.end()) return *it->second;
  auto state = std::make_unique<JobState>();
  state->job = job;
  const absl::Time t0 = absl::Now();
  state->setup = bound.ok() ? SetUp(*state) : bound;
  {
    // Formatted only when asked for (Describe): this runs once per job on the dispatcher.
    absl::MutexLock lock(&mu_);
    last_setup_ = SetUpSample{absl::Now() - t0,
                              4 * (job->plan().src_blocks().size() +
                                   job->plan().dst_blocks().size()),
                              job->plan().src_blocks().pinned()};
  }
  if (first_job_text_pending_) first_launch_from_ = absl::Now();
  JobState& ref = *state;
  states_.emplace(job.get(), std::move(state));
  absl::MutexLock lock(&mu_);
  held_states_ = states_.size();
  return ref;
}

absl::Status DeviceWorker::SetUp(JobState& s) {
  const Job& job = *s.job;
  const MemoryRef src = job.src(), dst = job.dst();
  const absl::Time t0 = absl::Now();
  KVRAIL_ASSIGN_OR_RETURN(s.src, job.DeviceAddress(Job::Side::kSrc, device_));
  KVRAIL_ASSIGN_OR_RETURN(s.dst, job.DeviceAddress(Job::Side::kDst, device_));
  s.setup_addresses = absl::Now() - t0;
  if (job.plan().src_per_layer() || job.plan().dst_per_layer()) {
    KVRAIL_ASSIGN_OR_RETURN(auto src_layers, job.DeviceLayerBases(Job::Side::kSrc, device_));
    KVRAIL_ASSIGN_OR_RETURN(auto dst_layers, job.DeviceLayerBases(Job::Side::kDst, device_));
    s.device_plan = job.plan().WithLayerBases(std::move(src_layers), std::move(dst_layers));
    // Run offsets of a per-layer side are whole addresses (kernels::SideBase is 0).
    if (job.plan().src_per_layer()) s.src = nullptr;
    if (job.plan().dst_per_layer()) s.dst = nullptr;
  }
  bool peer_unreachable = false;
  if (src.cuda && dst.cuda && src.device != dst.device) {
    const int other = src.device == device_ ? dst.device : src.device;
    peer_unreachable = !cuda::EnablePeerAccess(device_, other).ok();
  }
  scheduler::ModeInputs in = ModeInputsFor(job, peer_unreachable);
  // Copy-engine runs between two GPUs cost what the warm-up measured for the pair (this GPU and
  // the other side); same-GPU plans their own measured cost; host sides the default.
  if (src.cuda && dst.cuda) {
    const int other = src.device == device_ ? dst.device : src.device;
    if (copy_costs_.measured(device_, other)) {
      in.copy_engine_seconds_per_run = copy_costs_.SecondsPerRun(device_, other);
    }
  }
  const scheduler::ModeChoice choice = scheduler::ChoosePlanMode(in);
  s.mode = choice.mode;
  s.max_ctas = choice.max_ctas;
  s.tuner_key = scheduler::CtaTunerKey(in.mean_run_bytes, dst.cuda, dst.device == device_);
  // The copy-only mode's small kernels learn their own knee, within their own budget.
  if (choice.copy_only_kernel) s.tuner_key += kCopyOnlyTunerKeys;
  s.copy_only_kernel = choice.copy_only_kernel;
  // Kernel and copy engines together: ordinary kernel plans only (the copy-engine-only mode's
  // small kernels spare the SMs on purpose; digest jobs hash what their kernel moved).
  s.may_split = s.mode == Mode::kKernel && !choice.copy_only_kernel && !job.wants_digest() &&
                options_.copy_split_max_percent > 0;
  std::optional<Job::ReadyGate> gate;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = admitted_gates_.find(&job); it != admitted_gates_.end()) gate = it->second.gate;
  }
  if (gate.has_value()) {
    if (s.mode != Mode::kKernel) {
      return absl::FailedPreconditionError(absl::StrCat(
          gate->field, ": the plan runs on the copy engines on GPU", device_,
          " (", choice.reason, "), which cannot wait for the flags on the GPU"));
    }
    s.may_split = false;  // the copy part would run on the copy stream, not behind the wait
  }
  s.copy_gbps_prior = choice.copy_engine_gbps > 0
                          ? choice.copy_engine_gbps
                          : scheduler::EstimateCopyEngineGbps(in.mean_run_bytes);
  if (!choice.reason.empty()) {
    s.job->OnEngineNote(choice.reason);
    absl::MutexLock lock(&mu_);
    (choice.copy_only_kernel ? copy_only_kernel_plans_ : slow_copy_plans_)++;
    last_mode_note_ = choice.reason;
    // The log: once per plan whose choice is worth an operator's attention (rare by design:
    // only the copy-engine-only mode and unreachable peers produce one).
    spdlog::info("cuda:{} transfer plan: {}", device_, choice.reason);
  }
  // A digest job needs the uploaded plan in copy-engine mode too (its hash kernels).
  const absl::Time t_upload = absl::Now();
  s.setup_mode = t_upload - t0 - s.setup_addresses;
  if (s.mode == Mode::kKernel || job.wants_digest()) {
    const planner::Plan& plan = s.RunPlan();
    // From a pinned staging slot when one is free: the whole image in one copy when it fits
    // (the tables are then copied on the host and need not be held), else the header.
    StagingSlot* staging = staging_.empty() ? nullptr : TakeStaging();
    const bool staged_whole = staging != nullptr && kernels::LayoutPlanImage(plan.header()).bytes <=
                                                        kStagingSlotBytes;
    KVRAIL_ASSIGN_OR_RETURN(kernels::DevicePlanBuffer buffer,
                     kernels::DevicePlanBuffer::Upload(
                         plan.header(), plan.src_blocks().data(), plan.dst_blocks().data(),
                         reinterpret_cast<uint64_t>(s.src), reinterpret_cast<uint64_t>(s.dst),
                         stream_.get(), staging != nullptr ? staging->memory : nullptr,
                         staging != nullptr ? kStagingSlotBytes : 0));
    s.plan.emplace(std::move(buffer));
    if (staging != nullptr) KVRAIL_RETURN_IF_ERROR(PassedStaging(*staging));
    if (!staged_whole && (plan.src_blocks().pinned() || plan.dst_blocks().pinned())) {
      KVRAIL_ASSIGN_OR_RETURN(s.uploaded, cuda::Event::Create());
      KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaEventRecord(s.uploaded.get(), stream_.get()),
                                       "cudaEventRecord(plan uploaded)"));
      s.src_tables = plan.src_blocks().Hold();
      s.dst_tables = plan.dst_blocks().Hold();
    }
  }
  if (job.wants_digest()) {
    KVRAIL_ASSIGN_OR_RETURN(kernels::TileDigestBuffer digests,
                            kernels::TileDigestBuffer::Create(job.plan().num_tiles(),
                                                              stream_.get()));
    s.digests.emplace(std::move(digests));
  }
  if (gate.has_value()) {
    // A stream pair of the pool (a pending wait blocks its copy stream), after the plan's upload.
    KVRAIL_ASSIGN_OR_RETURN(s.gate_streams, TakeGateStreams(gate->field));
    s.gate_stream = gate_pool_[s.gate_streams].copy.get();
    KVRAIL_ASSIGN_OR_RETURN(s.gate_uploaded, cuda::Event::Create());
    KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(
        cudaEventRecord(s.gate_uploaded.get(), stream_.get()), "cudaEventRecord(gate upload)"));
    KVRAIL_RETURN_IF_ERROR(
        cuda::CudaStatus(cudaStreamWaitEvent(s.gate_stream, s.gate_uploaded.get(), 0),
                         "cudaStreamWaitEvent(gate upload)"));
    KVRAIL_RETURN_IF_ERROR(ArmGate(s, *gate));
    s.gate = std::move(gate);
    s.job->OnEngineNote(absl::StrCat("layers wait for ", s.gate->field,
                                     " on the GPU (cuStreamWaitValue32 on the job's stream)"));
  }
  s.setup_upload = absl::Now() - t_upload;
  s.job->OnEngineUsed(scheduler::ModeEngineName(s.mode));
  return absl::OkStatus();
}

absl::Status DeviceWorker::MakeStaging() {
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(
      cudaHostAlloc(&staging_memory_, kStagingSlots * kStagingSlotBytes, cudaHostAllocDefault),
      "cudaHostAlloc(plan staging)"));
  std::memset(staging_memory_, 0, kStagingSlots * kStagingSlotBytes);
  std::vector<StagingSlot> slots(kStagingSlots);
  for (size_t i = 0; i < kStagingSlots; ++i) {
    slots[i].memory = static_cast<uint8_t*>(staging_memory_) + i * kStagingSlotBytes;
    KVRAIL_ASSIGN_OR_RETURN(slots[i].passed, cuda::Event::Create());
  }
  staging_ = std::move(slots);
  return absl::OkStatus();
}

DeviceWorker::StagingSlot* DeviceWorker::TakeStaging() {
  for (size_t i = 0; i < staging_.size(); ++i) {
    const size_t k = (next_staging_ + i) % staging_.size();
    StagingSlot& slot = staging_[k];
    if (slot.recorded && cudaEventQuery(slot.passed.get()) != cudaSuccess) continue;
    next_staging_ = (k + 1) % staging_.size();
    return &slot;
  }
  return nullptr;
}

absl::Status DeviceWorker::PassedStaging(StagingSlot& slot) {
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaEventRecord(slot.passed.get(), stream_.get()),
                                          "cudaEventRecord(plan staging)"));
  slot.recorded = true;
  return absl::OkStatus();
}

void DeviceWorker::SpinForWork() {
  {
    absl::MutexLock lock(&mu_);
    if (HasWorkOrStop()) return;
    work_hint_.store(false, std::memory_order_relaxed);
  }
  const absl::Time until = absl::Now() + absl::Microseconds(options_.dispatcher_spin_us);
  while (!work_hint_.load(std::memory_order_acquire) && absl::Now() < until) CpuRelax();
}

}  // namespace kvrail::engine::cuda_detail
