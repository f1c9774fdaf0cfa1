// The CUDA engine: one dispatcher thread and one stream per GPU. It executes what the scheduler's
// pure policy decides (//daemon/scheduler: tile_queues for the order, cuda_batch_policy for
// batches, mode and CTAs); see docs/architecture.md ("CUDA engine").
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/cuda/context_sync.h"
#include "base/cuda/cuda_util.h"
#include "daemon/engine/cuda_engine.h"
#include "daemon/engine/engine.h"
#include "daemon/planner/table_pool.h"
#include "daemon/scheduler/cuda_batch_policy.h"
#include "daemon/scheduler/stream_gate.h"
#include "daemon/scheduler/tile_queues.h"
#include "kernels/kv_copy.h"
#include "kernels/kv_digest.h"
#include "kernels/plan_image.h"

namespace kvrail::engine {
namespace {

using scheduler::CopyRun;
using scheduler::CtaTuner;
using scheduler::MayStart;
using scheduler::Mode;
using scheduler::SplitTuner;
using scheduler::TileQueues;
using scheduler::WithinClass;

constexpr int kThreadsPerCta = 512;
constexpr size_t kMaxInFlight = 2;  // batches queued on the stream: the next launch hides the gap
// CTAs of the digest's hash-only kernels after a copy-engine batch (spec.digest).
constexpr int kDigestCtas = 16;
// Pinned block-table memory kept free for the next plans (a 262k-block transfer needs 2 MiB).
constexpr uint64_t kRetainedTableBytes = 64 << 20;
// Stream-ordered pool memory kept between plan buffers (cudaMemPoolAttrReleaseThreshold).
constexpr uint64_t kRetainedPoolBytes = 64 << 20;
// Pinned table buffers made at start, per size class from 4 KiB to 4 MiB (two each): a first
// plan finds its tables' memory without a cudaHostAlloc.
constexpr size_t kWarmTableMinBytes = 4 << 10, kWarmTableMaxBytes = 4 << 20;
// Tuner keys of the copy-only mode's small kernels start here (CtaTunerKey stays below 200).
constexpr int kCopyOnlyTunerKeys = 1 << 10;
// While gated copies wait, the dispatcher also looks at their producers' words this often: a
// batch whose words have come is completed by a blocking event wait (its kernel started on the
// GPU at the word; ~20 us for 16 MiB) instead of waiting for the host function's wake-up, which
// cost ~40-120 us more than the readiness poller's path on one H200 (docs/benchmarks.md
// "issue 19 (SW)").
constexpr absl::Duration kGateWordPoll = absl::Microseconds(20);
// Pinned staging for plan uploads (CudaEngineOptions::staged_plan_upload): slots of this size
// (a plan image of up to ~32k block ids in all fits whole), each reused once its upload passed.
constexpr size_t kStagingSlots = 8;
constexpr size_t kStagingSlotBytes = 128 << 10;

// The dispatcher's idle spin (CudaEngineOptions::dispatcher_spin_us).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
constexpr absl::Duration kGateReleaseGrace = absl::Seconds(1);
// The gate watchdog's tick, and how long one release waits for the abort stream's done word
// (then it tries again at the next tick; the producer's words are never raised before).
constexpr absl::Duration kGateWatchTick = absl::Microseconds(500);
constexpr absl::Duration kGateDisarmWait = absl::Milliseconds(50);
// Abort/done word pairs in the worker's mapped abort page (slots reused oldest-freed first).
constexpr int kGateWordPairs = 512;

bool Reached(uint32_t word, uint32_t value) { return static_cast<int32_t>(word - value) >= 0; }

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
// cuStreamWaitValue32 through the runtime's driver entry point (nothing links libcuda); nullptr
// when the driver offers none.
WaitValue32Fn StreamWaitValue32() {
  static const WaitValue32Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess) {
      (void)cudaGetLastError();
      return static_cast<WaitValue32Fn>(nullptr);
    }
    return reinterpret_cast<WaitValue32Fn>(p);
  }();
  return fn;
}

using WriteValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
WriteValue32Fn StreamWriteValue32() {
  static const WriteValue32Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess) {
      (void)cudaGetLastError();
      return static_cast<WriteValue32Fn>(nullptr);
    }
    return reinterpret_cast<WriteValue32Fn>(p);
  }();
  return fn;
}

// One gated job's release state, shared by the dispatcher (set-up, launches, completions) and
// the gate watchdog, which decides (scheduler::DecideGateRelease) and releases with CPU stores
// only: it raises the abort word, waits for the done word (the job's abort stream, armed at
// set-up behind cuStreamWaitValue32 on the abort word, has then zeroed num_tiles in the job's
// device plan header), then raises the producer's unwritten words, so the pending waits pass and
// the disarmed kernels store nothing. No CUDA call, so a release cannot itself block behind the
// waits it is meant to end. Thread-safe (mu; `armed` and `launched_end` atomic; the rest is
// immutable once the control is registered with the watchdog).
struct GateControl {
  std::weak_ptr<Job> job;
  Job::ReadyGate gate;
  uint32_t* abort_word = nullptr;  // host addresses in the worker's abort page
  const uint32_t* done_word = nullptr;
  uint32_t epoch = 0;  // the abort stream waits for abort_word >= epoch, writes done = epoch
  int slot = -1;
  std::atomic<bool> armed{false};
  std::atomic<uint32_t> launched_end{0};  // layers [0, launched_end) have their waits enqueued
  absl::Mutex mu;
  bool aborted ABSL_GUARDED_BY(mu) = false;   // no kernel of the job copies any more
  bool fired ABSL_GUARDED_BY(mu) = false;     // abort word stored
  bool released ABSL_GUARDED_BY(mu) = false;  // the producer's words raised
  absl::Status end ABSL_GUARDED_BY(mu);
  std::optional<absl::Time> ended_seen ABSL_GUARDED_BY(mu);

  bool Aborted(absl::Status* why) {
    absl::MutexLock lock(&mu);
    if (aborted && why != nullptr) *why = end;
    return aborted;
  }
  // Stores the abort word (once). Under mu.
  void FireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (fired || !armed.load(std::memory_order_acquire)) return;
    __atomic_store_n(abort_word, epoch, __ATOMIC_RELEASE);
    fired = true;
  }
};

// Bytes of the tiles from `first` to the end of its layer (a gated job's batch stops there: each
// layer waits on its own word).
uint64_t LayerBytesFrom(const planner::Plan& plan, uint32_t first) {
  const uint32_t layer = plan.tile(first).layer;
  uint64_t bytes = 0;
  for (uint32_t t = first; t < plan.num_tiles() && plan.tile(t).layer == layer; ++t) {
    bytes += plan.tile(t).bytes;
  }
  return bytes;
}

struct JobState;

// Tiles [begin, end) of `job`, taken from class `cls`'s queue (`bytes` of them).
struct Taken {
  std::shared_ptr<Job> job;
  int cls = 0;
  uint32_t begin = 0, end = 0;
  uint64_t bytes = 0;
  // Smaller than the class's batch because the job just started (the ramp): its launch overhead
  // weighs more, so the tuner does not learn from it.
  bool ramped = false;
  // The dispatcher took it this long after the latest Enqueue (its wake-up, when it was idle).
  absl::Duration since_enqueue;
};

// A taken batch once launched (or failed to launch).
struct Batch {
  JobState* state = nullptr;
  Taken taken;
  int ctas = 0;  // 0: copy engine
  bool capped = false;  // ctas lowered to the class's max_ctas (not the tuner's own choice)
  cuda::Event start, stop;
  // Kernel and copy engines together: tiles [split, end) ran on the copy engines (second stream)
  // beside the kernel's [begin, split); each part's end is timed from `start`.
  uint32_t split = 0;
  bool split_sampled = false;  // launched at the SplitTuner's choice (not while the knee probed)
  cuda::Event kernel_done, copy_done;
  absl::Status launch;
};

// What the dispatcher knows about a job it has started (dispatcher thread only).
struct JobState {
  std::shared_ptr<Job> job;
  absl::Status setup;  // not OK: every tile of the job fails with it
  Mode mode = Mode::kKernel;
  int max_ctas = 0;  // kernel: the most CTAs a launch may use (ChoosePlanMode)
  int tuner_key = 0;
  // Kernel batches may hand their last tiles to the copy engines (SplitTuner of tuner_key).
  bool may_split = false;
  double copy_gbps_prior = 0;  // EstimateCopyEngineGbps of the plan's runs
  bool split_said = false;     // OnEngineUsed("cuda-copy-engine") sent for a split batch
  uint8_t* src = nullptr;  // device-visible bases (nullptr for per-layer sides)
  uint8_t* dst = nullptr;
  // Per-layer sides: the plan with the layers' addresses on this engine's GPU (the job's plan
  // holds the owner's); what copy-engine runs and the kernel upload read.
  std::optional<planner::Plan> device_plan;
  const planner::Plan& RunPlan() const { return device_plan ? *device_plan : job->plan(); }
  std::optional<kernels::DevicePlanBuffer> plan;
  // spec.digest (issue 17): per-tile source and destination digests (kernels/kv_digest.h).
  std::optional<kernels::TileDigestBuffer> digests;
  // A plan uploaded from pinned tables: the copy runs after SetUp returns, so the tables are
  // held until `uploaded` has passed (the first batch's completion implies it; a job dropped
  // without one waits for it here).
  cuda::Event uploaded;
  std::shared_ptr<const void> src_tables, dst_tables;
  int in_flight = 0;
  // Where the job's running time went: GPU time of its batches (events) against the wall time
  // from its first launch to its latest completion.
  std::optional<absl::Time> first_launch;
  double gpu_seconds = 0;
  uint64_t bytes_done = 0;
  uint32_t batches = 0;
  uint64_t last_batch_bytes = 0;  // of the latest batch launched (the ramp, cuda_batch.h)
  // Where the set-up's time went (the first job's shows in Describe: first-transfer costs).
  absl::Duration setup_addresses, setup_mode, setup_upload;
  // GPU-side readiness wait (admitted by AdmitGated): the job's batches run on `gate_stream`,
  // each behind cuStreamWaitValue32 on its layer's word, and complete out of the dispatcher's
  // in-flight pipeline (`gated`, oldest first). An ended job zeroes its device header's
  // num_tiles (its kernels then store nothing) and has its words released (stream_gate.h).
  std::optional<Job::ReadyGate> gate;
  std::optional<cuda::Stream> gate_stream;
  cuda::Event gate_uploaded;
  std::list<Batch> gated;
  // The release state shared with the gate watchdog, the abort stream (armed at set-up) and the
  // event after its last op (the plan buffer is freed after it).
  std::shared_ptr<GateControl> gate_control;
  std::optional<cuda::Stream> gate_abort_stream;
  cuda::Event gate_abort_done;

  JobState() = default;
  JobState(const JobState&) = delete;
  JobState& operator=(const JobState&) = delete;
  ~JobState() {
    if (uploaded.get() != nullptr && src_tables != nullptr) cudaEventSynchronize(uploaded.get());
  }
};

// Serves one GPU. Thread contract: Enqueue/Remove/QueuedTiles/Describe from any thread (guarded
// by mu_); everything else runs on the dispatcher thread, which owns the stream, the job states
// and the tuners.
class DeviceWorker {
 public:
  DeviceWorker(int device, const CudaEngineOptions& options, cuda::Stream stream)
      : device_(device), options_(options), stream_(std::move(stream)) {
    Beat();
    thread_ = std::thread([this] { Run(); });
    if (options_.stream_wait) watchdog_ = std::thread([this] { Watch(); });
  }
  ~DeviceWorker() {
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

  void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) {
    absl::MutexLock lock(&mu_);
    queues_.Add(job, tiles);
    last_enqueue_ = absl::Now();
    work_hint_.store(true, std::memory_order_release);  // ends the dispatcher's idle spin
  }

  size_t Remove(const Job* job) {
    absl::MutexLock lock(&mu_);
    return queues_.Remove(job);
  }

  // Engine::AdmitGated for this GPU (scheduler::GateSlots decides; any thread).
  bool AdmitGated(const std::shared_ptr<Job>& job) {
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
      in.enabled = abort_device_ != 0 && StreamWriteValue32() != nullptr;
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

  void AddQueued(std::vector<uint64_t>* out) const {
    absl::MutexLock lock(&mu_);
    queues_.AddCounts(out);
  }

  std::string Describe() const {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return absl::StrCat("cuda:", device_, " BROKEN: ", broken_.message());
    return absl::StrCat("cuda:", device_, " ", warm_up_text_, last_decision_, ", budget ",
                        options_.max_ctas,
                        " CTAs; ", kernel_batches_, " kernel / ", copy_batches_,
                        " copy-engine batches",
                        split_batches_ > 0 ? absl::StrCat(" (", split_batches_,
                                                          " kernel batches split with the copy "
                                                          "engines)")
                                           : std::string(),
                        "; ", CopyOnlyTextLocked(), held_states_,
                        " jobs set up (plan on the GPU); last job set-up (plan upload enqueued) ",
                        SetUpTextLocked(), LastJobTextLocked(), first_job_text_,
                        GateTextLocked());
  }

  // Blocks until the dispatcher has warmed its GPU up (or found it cannot).
  void AwaitWarm() const {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&warm_done_));
  }
 private:
  // What the copy-engine-only mode (or an unreachable peer) decided against the copy engines'
  // per-run cost; empty when nothing was.
  std::string GateTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!options_.stream_wait) return "";
    return absl::StrCat("; stream wait: ", gate_slots_.held(), " of ", options_.stream_wait_jobs,
                        " jobs waiting on the GPU, ", gate_releases_,
                        " released by the daemon (", gate_bound_releases_,
                        " for a call blocked behind a wait, bound ",
                        options_.stream_wait_sync_bound_ms, " ms); last choice: ",
                        last_gate_choice_.empty() ? "none" : last_gate_choice_);
  }

  std::string CopyOnlyTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (copy_only_kernel_plans_ == 0 && slow_copy_plans_ == 0) return "";
    return absl::StrCat(copy_only_kernel_plans_, " tiny-run plans on a small kernel / ",
                        slow_copy_plans_, " slow plans kept on the copy engines (latest: ",
                        last_mode_note_, "); ");
  }

  std::string SetUpTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!last_setup_.has_value()) return "none yet";
    return absl::StrFormat("%.0f us (%.1f MiB of block tables, %s)",
                           absl::ToDoubleMicroseconds(last_setup_->took),
                           last_setup_->table_bytes / 1048576.0,
                           last_setup_->pinned ? "pinned" : "pageable");
  }

  std::string LastJobTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!last_job_.has_value()) return "";
    const JobSample& j = *last_job_;
    return absl::StrFormat(
        "; last job so far: %u batches, GPU busy %.3f of %.3f ms since its first launch "
        "(%.1f GB/s while busy)",
        j.batches, j.gpu_seconds * 1e3, j.wall_seconds * 1e3,
        j.gpu_seconds > 0 ? j.bytes / j.gpu_seconds / 1e9 : 0.0);
  }

  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !queues_.AllEmpty();
  }
  // Also true when a gated batch's stream passed its completion (WakeFromGpu).
  bool HasWorkOrGpuWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return HasWorkOrStop() || gpu_wakes_ != gpu_wakes_seen_;
  }
  // cudaLaunchHostFunc after each gated batch: wakes the dispatcher (no CUDA calls here).
  static void CUDART_CB WakeFromGpu(void* self) {
    auto* worker = static_cast<DeviceWorker*>(self);
    absl::MutexLock lock(&worker->mu_);
    ++worker->gpu_wakes_;
  }


  // Takes the next batch in priority order (fewest queued tiles first within a class) that the
  // class's byte limit allows, or nothing; counts its bytes as in flight for the class.
  std::optional<Taken> TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  bool HasQueuedLocked(const Job* job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queues_.Contains(job);
  }


  // Start-up work that would otherwise land in the first transfer (dispatcher thread): the
  // kernels' lazy module load, and the stream-ordered pool (plan buffers) keeping its memory
  // between plans instead of giving it back at every synchronization.
  absl::Status WarmUp() {
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
    absl::MutexLock lock(&mu_);
    warm_up_text_ = absl::StrFormat("warmed up in %.1f ms; ",
                                    absl::ToDoubleMilliseconds(absl::Now() - t0));
    return absl::OkStatus();
  }

  void Run() {
    // Binds this thread to its GPU for good: every event and launch below goes there. Code that
    // visits another GPU from this thread (closing another GPU's mapping, enabling peer access)
    // does so under a cuda::ScopedDevice, which gives the thread back its GPU.
    absl::Status bound = cuda::SetDevice(device_);
    if (bound.ok() && options_.stream_wait) {
      // Made before serving: cudaHostAlloc may synchronize the context, which must not happen
      // while a gated job's wait is pending.
      if (absl::Status page = MakeAbortPage(); !page.ok()) {
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
            // Gated batches complete on their own streams: woken by WakeFromGpu, and every
            // kGateWordPoll to see whether a producer's word has come (PollGated).
            mu_.AwaitWithTimeout(absl::Condition(this, &DeviceWorker::HasWorkOrGpuWake),
                                 kGateWordPoll);
          }
          gpu_wakes_seen_ = gpu_wakes_;
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

  // Completes the gated batches whose streams have passed, in order per job (a released job's
  // too: the watchdog disarmed its kernels and raised its words).
  void PollGated() {
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

  bool GateWordsCame(const JobState& s, const Batch& b) const {
    const uint32_t first = s.job->plan().tile(b.taken.begin).layer;
    const uint32_t last = s.job->plan().tile(b.taken.end - 1).layer;
    for (uint32_t l = first; l <= last && l < s.gate->count; ++l) {
      if (!Reached(__atomic_load_n(&s.gate->host_words[l], __ATOMIC_ACQUIRE), s.gate->value)) {
        return false;
      }
    }
    return true;
  }

  // The worker's abort page: kGateWordPairs (abort, done) word pairs in pinned host memory
  // mapped for the GPU (the abort streams wait on and write them; the watchdog stores and reads
  // them from the CPU).
  absl::Status MakeAbortPage() {
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

  void Beat() {
    beat_ns_.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
  }

  // The gate watchdog (its own thread; no CUDA call): every kGateWatchTick, each registered gated
  // job's release decision (scheduler::DecideGateRelease) and, when it says so, the release.
  void Watch() {
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

  void WatchOne(GateControl& c, absl::Time now, const std::optional<cuda::OpenContextSync>& sync,
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

  // Disarms the job's kernels (abort word, then the abort stream's done word), then raises its
  // producer's unwritten words. False when the done word has not shown within kGateDisarmWait.
  static bool ReleaseGate(GateControl& c, const absl::Status& why, uint32_t* raised) {
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

  // A gated job's state is about to go: its abort stream fires (zeroing the header of a finished
  // plan is harmless) and the plan buffer's stream-ordered free waits for it; the watchdog stops
  // watching it; its word pair goes back (reused last).
  void RetireGate(JobState& s) {
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

  // Drops states of jobs with nothing queued or running that will get no more tiles (their plan
  // buffers are freed). A layer-wise job keeps its uploaded plan between layers.
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  bool Finished(const JobState& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return s.in_flight == 0 && !HasQueuedLocked(s.job.get()) && !s.job->MayGetMoreTiles();
  }

  std::unique_ptr<JobState> TakeIfFinishedLocked(JobState* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  void ForgetGateLocked(const Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (admitted_gates_.erase(job) > 0) gate_slots_.Release(job);
  }

  scheduler::ModeInputs ModeInputsFor(const Job& job, bool peer_unreachable) const {
    scheduler::ModeInputs in;
    in.max_ctas = options_.max_ctas;
    in.mean_run_bytes = scheduler::MeanRunBytes(job.plan());
    in.copy_engine_min_run = options_.copy_engine_min_run_bytes;
    in.peer_unreachable = peer_unreachable;
    in.copy_only_kernel_ctas = options_.copy_only_kernel_ctas;
    in.copy_only_kernel_below_run = options_.copy_only_kernel_below_run_bytes;
    return in;
  }

  JobState& StateFor(const std::shared_ptr<Job>& job, const absl::Status& bound) {
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

  absl::Status SetUp(JobState& s) {
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
    const scheduler::ModeInputs in = ModeInputsFor(job, peer_unreachable);
    const scheduler::ModeChoice choice = scheduler::ChoosePlanMode(in);
    s.mode = choice.mode;
    s.max_ctas = choice.max_ctas;
    s.tuner_key = scheduler::CtaTunerKey(in.mean_run_bytes, dst.cuda, dst.device == device_);
    // The copy-only mode's small kernels learn their own knee, within their own budget.
    if (choice.copy_only_kernel) s.tuner_key += kCopyOnlyTunerKeys;
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
                              kernels::TileDigestBuffer::Create(job.plan().num_tiles(), stream_.get()));
      s.digests.emplace(std::move(digests));
    }
    if (gate.has_value()) {
      // The job's own stream (a pending wait blocks it), after the plan's upload.
      KVRAIL_ASSIGN_OR_RETURN(cuda::Stream gate_stream, cuda::Stream::Create(device_));
      KVRAIL_ASSIGN_OR_RETURN(s.gate_uploaded, cuda::Event::Create());
      KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(
          cudaEventRecord(s.gate_uploaded.get(), stream_.get()), "cudaEventRecord(gate upload)"));
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaStreamWaitEvent(gate_stream.get(), s.gate_uploaded.get(), 0),
                           "cudaStreamWaitEvent(gate upload)"));
      s.gate_stream.emplace(std::move(gate_stream));
      KVRAIL_RETURN_IF_ERROR(ArmGate(s, *gate));
      s.gate = std::move(gate);
      s.job->OnEngineNote(absl::StrCat("layers wait for ", s.gate->field,
                                       " on the GPU (cuStreamWaitValue32 on the job's stream)"));
    }
    s.setup_upload = absl::Now() - t_upload;
    s.job->OnEngineUsed(scheduler::ModeEngineName(s.mode));
    return absl::OkStatus();
  }

  // The job's abort stream: after the plan upload, it waits for the job's abort word, then zeroes
  // num_tiles in the device plan header and writes the done word (cuStreamWriteValue32, no
  // kernel). Registered with the gate watchdog once armed.
  absl::Status ArmGate(JobState& s, const Job::ReadyGate& gate) {
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
    KVRAIL_ASSIGN_OR_RETURN(cuda::Stream abort_stream, cuda::Stream::Create(device_));
    KVRAIL_ASSIGN_OR_RETURN(s.gate_abort_done, cuda::Event::Create());
    const CUstream as = reinterpret_cast<CUstream>(abort_stream.get());
    KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(
        cudaStreamWaitEvent(abort_stream.get(), s.gate_uploaded.get(), 0),
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
                          abort_stream.get()),
          "cudaMemsetAsync(gate abort: num_tiles)"));
      const CUresult w =
          StreamWriteValue32()(as, abort_device + 4, c->epoch, CU_STREAM_WRITE_VALUE_DEFAULT);
      if (w != CUDA_SUCCESS) {
        return absl::InternalError(
            absl::StrCat("cuStreamWriteValue32(gate abort: done word) failed: CUresult ", w));
      }
      return cuda::CudaStatus(cudaEventRecord(s.gate_abort_done.get(), abort_stream.get()),
                              "cudaEventRecord(gate abort)");
    }();
    if (!armed.ok()) {
      __atomic_store_n(c->abort_word, c->epoch, __ATOMIC_RELEASE);
      s.gate_abort_stream.emplace(std::move(abort_stream));
      return absl::Status(armed.code(), absl::StrCat(gate.field, ": arming the abort stream on GPU",
                                                     device_, ": ", armed.message()));
    }
    s.gate_abort_stream.emplace(std::move(abort_stream));
    c->armed.store(true, std::memory_order_release);
    absl::MutexLock lock(&watch_mu_);
    controls_.push_back(std::move(c));
    return absl::OkStatus();
  }

  // spec.digest, after a batch's copy on the stream: the source hashed by a hash-only kernel when
  // the copy engines moved it (the fused kernel hashed it already), the destination read back
  // and hashed, both copied to the host mirror Complete reads.
  absl::Status DigestBatch(JobState& s, uint32_t begin, uint32_t end, int ctas) {
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

  CtaTuner& TunerFor(int key, int max_ctas) {
    auto it = tuners_.find(key);
    if (it == tuners_.end()) {
      it = tuners_
               .emplace(key, CtaTuner(max_ctas, options_.fixed_ctas, options_.reprobe_batches))
               .first;
    }
    return it->second;
  }

  SplitTuner& SplitTunerFor(int key, double copy_gbps_prior) {
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

  // The second stream the copy-engine part of a split batch runs on (made on first use).
  absl::StatusOr<cudaStream_t> CopyStream() {
    if (!copy_stream_.has_value()) {
      KVRAIL_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create(device_));
      copy_stream_.emplace(std::move(stream));
    }
    return copy_stream_->get();
  }

  Batch Launch(JobState& s, const Taken& taken) {
    Batch b = LaunchBatch(s, taken);
    if (first_job_text_pending_) {
      // The daemon's first job after start: what its first batch waited for and cost here, so
      // a slow first transfer can be told apart from a slow engine (issue 19).
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

  Batch LaunchBatch(JobState& s, const Taken& taken) {
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
      const cudaStream_t stream = s.gate.has_value() ? s.gate_stream->get() : stream_.get();
      KVRAIL_ASSIGN_OR_RETURN(b.start, cuda::Event::Create());
      KVRAIL_ASSIGN_OR_RETURN(b.stop, cuda::Event::Create());
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
        while (seen < last + 1 && !s.gate_control->launched_end.compare_exchange_weak(seen, last + 1)) {
        }
      }
      KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaEventRecord(b.start.get(), stream), "cudaEventRecord"));
      if (s.mode == Mode::kKernel) {
        CtaTuner& ctas = TunerFor(s.tuner_key, s.max_ctas);
        b.ctas = ctas.Next(taken.bytes);
        const int class_max = static_cast<int>(options_.limits[cls].max_ctas);
        if (class_max > 0 && b.ctas > class_max) {
          b.ctas = class_max;
          b.capped = true;
        }
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
      KVRAIL_RETURN_IF_ERROR(
          cuda::CudaStatus(cudaEventRecord(b.stop.get(), stream), "cudaEventRecord"));
      if (!s.gate.has_value()) return absl::OkStatus();
      return cuda::CudaStatus(cudaLaunchHostFunc(stream, &DeviceWorker::WakeFromGpu, this),
                              "cudaLaunchHostFunc(gate wake)");
    }();
    return b;
  }

  // The copy-engine part of a split batch, on the second stream: it starts with the batch (waits
  // for `start`), and the main stream waits for it before `stop`, so the batch's completion (and
  // its GPU time) covers both parts.
  absl::Status LaunchCopyPart(const JobState& s, Batch& b) {
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

  absl::Status CopyEngine(const JobState& s, uint32_t begin, uint32_t end,
                          cudaStream_t stream = nullptr) {
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

  void Complete(Batch& b) {
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
        if (!b.capped && !b.taken.ramped) tuner.Report(b.ctas, kernel_bytes, kernel_seconds);
        decision = absl::StrFormat("kernel %d CTAs%s, now %s", b.ctas,
                                   b.capped ? " (class limit)" : "", tuner.Describe());
        if (s.may_split) {
          SplitTuner& splits = SplitTunerFor(s.tuner_key, s.copy_gbps_prior);
          if (b.split_sampled && !b.capped && !b.taken.ramped) splits.Report(split);
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
      absl::MutexLock lock(&mu_);
      (b.ctas > 0 ? kernel_batches_ : copy_batches_)++;
      if (b.split < b.taken.end) ++split_batches_;
      last_decision_ = absl::StrFormat("%s, %.1f GB/s last batch (%.1f MiB)", decision, gbps,
                                       static_cast<double>(b.taken.bytes) / (1 << 20));
      last_job_ = JobSample{s.batches, s.bytes_done, s.gpu_seconds,
                            absl::ToDoubleSeconds(absl::Now() - *s.first_launch)};
    }
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
    absl::MutexLock lock(&mu_);
    inflight_bytes_[b.taken.cls] -= b.taken.bytes;  // after the report, as in the host engine
  }

  const int device_;
  const CudaEngineOptions options_;
  cuda::Stream stream_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  TileQueues queues_ ABSL_GUARDED_BY(mu_){WithinClass::kFewestTilesFirst};
  std::string last_decision_ ABSL_GUARDED_BY(mu_) = "idle";
  struct SetUpSample {
    absl::Duration took;
    uint64_t table_bytes = 0;
    bool pinned = false;
  };
  std::optional<SetUpSample> last_setup_ ABSL_GUARDED_BY(mu_);
  struct JobSample {
    uint32_t batches = 0;
    uint64_t bytes = 0;
    double gpu_seconds = 0;
    double wall_seconds = 0;  // first launch -> this completion
  };
  std::optional<JobSample> last_job_ ABSL_GUARDED_BY(mu_);
  uint64_t kernel_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copy_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t split_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copy_only_kernel_plans_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t slow_copy_plans_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_mode_note_ ABSL_GUARDED_BY(mu_);
  bool warm_done_ ABSL_GUARDED_BY(mu_) = false;
  std::string warm_up_text_ ABSL_GUARDED_BY(mu_);
  std::string first_job_text_ ABSL_GUARDED_BY(mu_);
  absl::Time last_enqueue_ ABSL_GUARDED_BY(mu_);
  size_t held_states_ ABSL_GUARDED_BY(mu_) = 0;  // states_.size(), for Describe
  uint64_t inflight_bytes_[kNumPriorityClasses] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  // GPU-side readiness wait: admitted jobs (AdmitGated) until their state is dropped.
  struct AdmittedGate {
    std::weak_ptr<Job> job;
    Job::ReadyGate gate;
  };
  scheduler::GateSlots gate_slots_ ABSL_GUARDED_BY(mu_){options_.stream_wait_jobs};
  std::unordered_map<const Job*, AdmittedGate> admitted_gates_ ABSL_GUARDED_BY(mu_);
  std::string last_gate_choice_ ABSL_GUARDED_BY(mu_);
  uint64_t gate_releases_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t gate_bound_releases_ ABSL_GUARDED_BY(mu_) = 0;  // of them, for a blocked call
  // The abort page (MakeAbortPage; 0 / nullptr: none, no stream wait).
  uint32_t* abort_host_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t abort_device_ ABSL_GUARDED_BY(mu_) = 0;
  // The gate watchdog: the armed gated jobs it watches, its stop flag; the dispatcher's last
  // loop turn (Beat) and whether the engine is stopping (then every wait is released).
  std::thread watchdog_;
  absl::Mutex watch_mu_;
  bool watch_stop_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::vector<std::shared_ptr<GateControl>> controls_ ABSL_GUARDED_BY(watch_mu_);
  std::atomic<int64_t> beat_ns_{0};
  std::atomic<bool> gates_stopping_{false};
  uint64_t gpu_wakes_ ABSL_GUARDED_BY(mu_) = 0;
  // Set by the first sticky CUDA error; every later batch fails with it.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // Dispatcher thread only (SweepLocked runs there too, under mu_ for the queue lookups).
  std::unordered_map<const Job*, std::unique_ptr<JobState>> states_;
  std::map<int, CtaTuner> tuners_;
  std::map<int, SplitTuner> split_tuners_;  // same keys as tuners_
  bool first_job_text_pending_ = true;
  absl::Time first_launch_from_;
  std::optional<cuda::Stream> copy_stream_;  // the copy-engine part of split batches
  int gated_pending_ = 0;  // gated batches launched and not completed (dispatcher only)
  std::deque<int> free_abort_slots_;  // word pairs of the abort page not in use (dispatcher)
  uint32_t gate_epoch_ = 0;
  uint64_t gpu_wakes_seen_ = 0;
  std::vector<CopyRun> runs_;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
  // Pinned plan-upload staging (CudaEngineOptions::staged_plan_upload; dispatcher only).
  struct StagingSlot {
    void* memory = nullptr;
    cuda::Event passed;  // recorded after the slot's latest upload
    bool recorded = false;
  };
  void* staging_memory_ = nullptr;
  std::vector<StagingSlot> staging_;
  size_t next_staging_ = 0;
  // Set by Enqueue, cleared by the dispatcher before its idle spin.
  std::atomic<bool> work_hint_{false};

  absl::Status MakeStaging() {
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

  // A staging slot whose last upload the stream has passed (round robin), or nullptr when all
  // are still in use (the upload then goes unstaged).
  StagingSlot* TakeStaging() {
    for (size_t i = 0; i < staging_.size(); ++i) {
      const size_t k = (next_staging_ + i) % staging_.size();
      StagingSlot& slot = staging_[k];
      if (slot.recorded && cudaEventQuery(slot.passed.get()) != cudaSuccess) continue;
      next_staging_ = (k + 1) % staging_.size();
      return &slot;
    }
    return nullptr;
  }

  absl::Status PassedStaging(StagingSlot& slot) {
    KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaEventRecord(slot.passed.get(), stream_.get()),
                                            "cudaEventRecord(plan staging)"));
    slot.recorded = true;
    return absl::OkStatus();
  }

  // The idle dispatcher spins up to dispatcher_spin_us for the next Enqueue before it sleeps on
  // mu_ (waking a sleeping thread costs tens of microseconds: a critical transfer's budget).
  void SpinForWork() {
    {
      absl::MutexLock lock(&mu_);
      if (HasWorkOrStop()) return;
      work_hint_.store(false, std::memory_order_relaxed);
    }
    const absl::Time until = absl::Now() + absl::Microseconds(options_.dispatcher_spin_us);
    while (!work_hint_.load(std::memory_order_acquire) && absl::Now() < until) CpuRelax();
  }
};

// Routes each job to the worker of its executing GPU. Thread-safe (workers are fixed at
// creation; each guards its own queues).
class CudaEngine final : public Engine {
 public:
  CudaEngine(std::vector<std::unique_ptr<DeviceWorker>> workers, std::vector<int> devices,
             bool run_on_destination)
      : workers_(std::move(workers)),
        devices_(std::move(devices)),
        run_on_destination_(run_on_destination),
        tables_(planner::TablePool::Create(PinnedAllocator(), kRetainedTableBytes)) {
    // Pinned table memory made now, not inside a first transfer (cudaHostAlloc costs up to
    // milliseconds): taken and given straight back, it stays in the pool for the first plans.
    std::vector<planner::TableAllocator::Memory> warm;
    for (size_t bytes = kWarmTableMinBytes; bytes <= kWarmTableMaxBytes; bytes *= 2) {
      warm.push_back(tables_->Take(bytes));
      warm.push_back(tables_->Take(bytes));
    }
  }

  std::string name() const override { return "cuda"; }

  void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) override {
    if (tiles.empty()) return;
    const MemoryRef src = job->src(), dst = job->dst();
    const int device = scheduler::ExecutingDevice(src.cuda, src.device, dst.cuda, dst.device,
                                                      run_on_destination_, devices_.front());
    DeviceWorker* worker = Worker(device);
    if (worker == nullptr) {
      const absl::Status status = absl::FailedPreconditionError(
          absl::StrCat("the CUDA engine does not serve GPU", device));
      for (uint32_t t : tiles) {
        job->OnTileStart(t);
        job->OnTileDone(t, status);
      }
      return;
    }
    worker->Enqueue(job, tiles);
  }

  bool AdmitGated(const std::shared_ptr<Job>& job) override {
    const MemoryRef src = job->src(), dst = job->dst();
    DeviceWorker* worker = Worker(scheduler::ExecutingDevice(
        src.cuda, src.device, dst.cuda, dst.device, run_on_destination_, devices_.front()));
    return worker != nullptr && worker->AdmitGated(job);
  }

  size_t Remove(const Job* job) override {
    size_t removed = 0;
    for (auto& w : workers_) removed += w->Remove(job);
    return removed;
  }

  std::vector<uint64_t> QueuedTiles() const override {
    std::vector<uint64_t> out(kNumPriorityClasses, 0);
    for (const auto& w : workers_) w->AddQueued(&out);
    return out;
  }

  std::string Describe() const override {
    std::vector<std::string> lines;
    for (const auto& w : workers_) lines.push_back(w->Describe());
    if (run_on_destination_) lines.push_back("GPU-to-GPU transfers run on the destination GPU");
    return absl::StrJoin(lines, "; ");
  }

  planner::TableAllocator* table_pool() const override { return tables_.get(); }

 private:
  DeviceWorker* Worker(int device) const {
    for (size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i] == device) return workers_[i].get();
    }
    return nullptr;
  }

  // Portable pinned host memory: any of the engine's GPUs copies from it without staging.
  static planner::TablePool::Allocator PinnedAllocator() {
    planner::TablePool::Allocator a;
    a.allocate = [](size_t bytes) -> void* {
      void* memory = nullptr;
      cuda::ContextSyncScope sync("cudaHostAlloc(block tables)");
      if (cudaHostAlloc(&memory, bytes, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
      }
      return memory;
    };
    a.release = [](void* memory) {
      cuda::ContextSyncScope sync("cudaFreeHost(block tables)");
      cudaFreeHost(memory);
    };
    a.pinned = true;
    return a;
  }

  const std::vector<std::unique_ptr<DeviceWorker>> workers_;
  const std::vector<int> devices_;
  const bool run_on_destination_;
  const std::shared_ptr<planner::TablePool> tables_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> CreateCudaEngine(const CudaEngineOptions& options) {
  KVRAIL_ASSIGN_OR_RETURN(const int count, cuda::DeviceCount());
  std::vector<int> devices = options.devices;
  if (devices.empty()) {
    for (int d = 0; d < count; ++d) devices.push_back(d);
  }
  std::vector<std::unique_ptr<DeviceWorker>> workers;
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return absl::InvalidArgumentError(absl::StrCat("cuda devices: GPU", d, " does not exist"));
    }
    KVRAIL_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create(d));
    workers.push_back(std::make_unique<DeviceWorker>(d, options, std::move(stream)));
  }
  // Serving starts warm (CudaEngineOptions::warm_up): every dispatcher has loaded its kernels.
  for (const auto& w : workers) w->AwaitWarm();
  return std::unique_ptr<Engine>(
      new CudaEngine(std::move(workers), std::move(devices), options.run_on_destination));
}

}  // namespace kvrail::engine
