// The CUDA engine's per-GPU dispatcher (DeviceWorker) and the state it keeps per job and batch.
// Private to //daemon/engine:cuda_engine (the public header is cuda_engine.h). Its definitions are
// in cuda_worker.cc (queues, dispatch loop, job set-up, staging), cuda_worker_launch.cc (batches:
// launch, copy-engine part, completion, tuners) and cuda_worker_gate.cc (the GPU-side readiness
// wait: admission, arming, the watchdog and its release).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/cuda/context_sync.h"
#include "base/cuda/cuda_util.h"
#include "daemon/engine/cuda/cuda_engine.h"
#include "daemon/engine/engine.h"
#include "daemon/scheduler/cuda_batch_policy.h"
#include "daemon/scheduler/stream_gate.h"
#include "daemon/scheduler/tile_queues.h"
#include "kernels/kv_copy.h"
#include "kernels/kv_digest.h"

namespace kvrail::engine::cuda_detail {

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
// Stream-ordered pool memory kept between plan buffers (cudaMemPoolAttrReleaseThreshold).
constexpr uint64_t kRetainedPoolBytes = 64 << 20;
// Tuner keys of the copy-only mode's small kernels start here (CtaTunerKey stays below 200).
constexpr int kCopyOnlyTunerKeys = 1 << 10;
// Batches of the daemon's first job traced in Describe ("first job's batches").
constexpr uint32_t kFirstJobTraceBatches = 32;
// While gated copies wait, the dispatcher looks at their producers' words this often (its thread
// runs with 1 ns timer slack then, else the default 50 us slack stretched each look to ~70 us): a
// batch whose words have come is completed by a blocking event wait (its kernel started on the
// GPU at the word; ~20 us for 16 MiB). No host function wakes it: a cudaLaunchHostFunc after each
// gated batch put a CPU round trip (the CUDA callback thread, then the stream resumed) between
// one layer's copy and the next on the job's stream, which the last layers of a prefill paid in
// full (docs/benchmarks.md).
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

inline bool Reached(uint32_t word, uint32_t value) {
  return static_cast<int32_t>(word - value) >= 0;
}

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
// cuStreamWaitValue32 through the runtime's driver entry point (nothing links libcuda); nullptr
// when the driver offers none. Likewise cuStreamWriteValue32.
WaitValue32Fn StreamWaitValue32();
using WriteValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
WriteValue32Fn StreamWriteValue32();

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
inline uint64_t LayerBytesFrom(const planner::Plan& plan, uint32_t first) {
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
  // How ctas was chosen (capped to the class's max_ctas, raised for a critical transfer; only the
  // tuner's own choice teaches it).
  scheduler::LaunchCtas chosen;
  // The daemon's first job only (JobState::trace_anchor): when its launch was enqueued, in us
  // after the job's first launch.
  double enqueued_us = -1;
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
  bool copy_only_kernel = false;  // the copy-engine-only mode's small kernel (ChoosePlanMode)
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
  // spec.digest: per-tile source and destination digests (kernels/kv_digest.h).
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
  // The daemon's first job (not gated): an event recorded before its first batch, from which
  // Complete times each batch's GPU start and end (Describe: "first job's batches"), so
  // gaps between the first job's batches can be told apart from a slow engine.
  cuda::Event trace_anchor;
  std::string trace;
  // Where the set-up's time went (the first job's shows in Describe: first-transfer costs).
  absl::Duration setup_addresses, setup_mode, setup_upload;
  // GPU-side readiness wait (admitted by AdmitGated): the job's batches run on `gate_stream`,
  // each behind cuStreamWaitValue32 on its layer's word, and complete out of the dispatcher's
  // in-flight pipeline (`gated`, oldest first). An ended job zeroes its device header's
  // num_tiles (its kernels then store nothing) and has its words released (stream_gate.h).
  std::optional<Job::ReadyGate> gate;
  // The job's copy and abort streams, a pair of the worker's pool (MakeGateStreams; -1: none):
  // borrowed while the job is set up, given back by RetireGate.
  int gate_streams = -1;
  cudaStream_t gate_stream = nullptr;
  cuda::Event gate_uploaded;
  std::list<Batch> gated;
  // The release state shared with the gate watchdog, the abort stream (armed at set-up) and the
  // event after its last op (the plan buffer is freed after it).
  std::shared_ptr<GateControl> gate_control;
  cudaStream_t gate_abort_stream = nullptr;
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
  DeviceWorker(int device, const CudaEngineOptions& options, cuda::Stream stream);
  ~DeviceWorker();

  void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) {
    absl::MutexLock lock(&mu_);
    queues_.Add(job, tiles);
    last_enqueue_ = absl::Now();
    work_hint_.store(true, std::memory_order_release);  // ends the dispatcher's idle spin
  }

  // Engine::FinishStartedFirst for this GPU's queues (any thread).
  void FinishStartedFirst() {
    absl::MutexLock lock(&mu_);
    queues_.FinishStartedFirst();
  }

  // Engine::Expect for this GPU (any thread): a sleeping dispatcher wakes now and spins up to
  // dispatcher_spin_us for the job being planned, so the job's Enqueue finds it awake (the wake-up
  // cost the first tile 25-60 us after an idle spell). Nothing without the spin.
  void Expect() {
    if (!options_.wake_on_submit || options_.dispatcher_spin_us <= 0) return;
    absl::MutexLock lock(&mu_);
    expect_ = true;
  }

  size_t Remove(const Job* job) {
    absl::MutexLock lock(&mu_);
    return queues_.Remove(job);
  }

  // Engine::AdmitGated for this GPU (scheduler::GateSlots decides; any thread).
  bool AdmitGated(const std::shared_ptr<Job>& job);

  void AddQueued(std::vector<uint64_t>* out) const {
    absl::MutexLock lock(&mu_);
    queues_.AddCounts(out);
  }

  std::string Describe() const;

  // Blocks until the dispatcher has warmed its GPU up (or found it cannot).
  void AwaitWarm() const {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&warm_done_));
  }

 private:
  // Describe's parts: the GPU stream wait's state; what the copy-engine-only mode (or an
  // unreachable peer) decided against the copy engines' per-run cost (empty when nothing was).
  std::string GateTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string CopyOnlyTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string SetUpTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string LastJobTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // expect_ too: the dispatcher wakes and then spins for the expected job (Expect).
  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || expect_ || !queues_.AllEmpty();
  }

  // Takes the next batch in priority order (fewest queued tiles first within a class) that the
  // class's byte limit allows, or nothing; counts its bytes as in flight for the class.
  std::optional<Taken> TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  bool HasQueuedLocked(const Job* job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queues_.Contains(job);
  }

  // Start-up work that would otherwise land in the first transfer (dispatcher thread): the
  // kernels' lazy module load, and the stream-ordered pool (plan buffers) keeping its memory
  // between plans instead of giving it back at every synchronization.
  absl::Status WarmUp();
  // Part of the warm-up (cuda_worker_launch.cc): the CTA tuners' knee probes for the serving run
  // sizes (scheduler::TunerSeedBlockBytes) on scratch memory, so no early transfer runs a probe
  // batch at half the CTAs. Returns the Describe text ("CTA knees seeded ...").
  absl::StatusOr<std::string> SeedTuners();
  // Part of the warm-up: the copy engines' cost per run from this GPU to itself and to each peer
  // GPU it can reach (CopyEngineSecondsPerRun of a scattered batch vs one contiguous copy), into
  // copy_costs_ for the plans' mode choice and SplitTuner prior. Returns the Describe text.
  absl::StatusOr<std::string> MeasureCopyEngineCosts();

  void Run();

  // Completes the gated batches whose streams have passed, in order per job (a released job's
  // too: the watchdog disarmed its kernels and raised its words).
  void PollGated();

  bool GateWordsCame(const JobState& s, const Batch& b) const;

  // The worker's abort page: kGateWordPairs (abort, done) word pairs in pinned host memory
  // mapped for the GPU (the abort streams wait on and write them; the watchdog stores and reads
  // them from the CPU).
  absl::Status MakeAbortPage();

  // The gated jobs' streams, made before serving (dispatcher): gate_queues_.max_jobs pairs (a
  // copy stream, an abort stream), after the dispatcher's and the copy-engine part's streams, so
  // that each parked wait has a hardware queue of its own (scheduler::PlanGateQueues). A job
  // borrows a pair (TakeGateStreams) instead of creating streams: streams made later, per job,
  // would be dealt onto queues that others already use.
  absl::Status MakeGateStreams();
  // A free pair's index; RESOURCE_EXHAUSTED naming `field` when none is (admission bounds the
  // jobs by the pool, so only a pool that could not be made runs out).
  absl::StatusOr<int> TakeGateStreams(const std::string& field);

  void Beat() {
    beat_ns_.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
  }

  // The gate watchdog (its own thread; no CUDA call): every kGateWatchTick, each registered gated
  // job's release decision (scheduler::DecideGateRelease) and, when it says so, the release.
  void Watch();

  void WatchOne(GateControl& c, absl::Time now, const std::optional<cuda::OpenContextSync>& sync,
                absl::Duration silent);

  // Disarms the job's kernels (abort word, then the abort stream's done word), then raises its
  // producer's unwritten words. False when the done word has not shown within kGateDisarmWait.
  static bool ReleaseGate(GateControl& c, const absl::Status& why, uint32_t* raised);

  // A gated job's state is about to go: its abort stream fires (zeroing the header of a finished
  // plan is harmless) and the plan buffer's stream-ordered free waits for it; the watchdog stops
  // watching it; its word pair goes back (reused last).
  void RetireGate(JobState& s);

  // Drops states of jobs with nothing queued or running that will get no more tiles (their plan
  // buffers are freed). A layer-wise job keeps its uploaded plan between layers.
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  bool Finished(const JobState& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return s.in_flight == 0 && !HasQueuedLocked(s.job.get()) && !s.job->MayGetMoreTiles();
  }

  std::unique_ptr<JobState> TakeIfFinishedLocked(JobState* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ForgetGateLocked(const Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (admitted_gates_.erase(job) > 0) gate_slots_.Release(job);
  }

  scheduler::ModeInputs ModeInputsFor(const Job& job, bool peer_unreachable) const;

  JobState& StateFor(const std::shared_ptr<Job>& job, const absl::Status& bound);

  absl::Status SetUp(JobState& s);

  // The job's abort stream: after the plan upload, it waits for the job's abort word, then zeroes
  // num_tiles in the device plan header and writes the done word (cuStreamWriteValue32, no
  // kernel). Registered with the gate watchdog once armed.
  absl::Status ArmGate(JobState& s, const Job::ReadyGate& gate);

  // spec.digest, after a batch's copy on the stream: the source hashed by a hash-only kernel when
  // the copy engines moved it (the fused kernel hashed it already), the destination read back
  // and hashed, both copied to the host mirror Complete reads.
  absl::Status DigestBatch(JobState& s, uint32_t begin, uint32_t end, int ctas);

  CtaTuner& TunerFor(int key, int max_ctas);

  SplitTuner& SplitTunerFor(int key, double copy_gbps_prior);

  // The second stream the copy-engine part of a split batch runs on (made on first use).
  absl::StatusOr<cudaStream_t> CopyStream();

  Batch Launch(JobState& s, const Taken& taken);

  Batch LaunchBatch(JobState& s, const Taken& taken);

  // The copy-engine part of a split batch, on the second stream: it starts with the batch (waits
  // for `start`), and the main stream waits for it before `stop`, so the batch's completion (and
  // its GPU time) covers both parts.
  absl::Status LaunchCopyPart(const JobState& s, Batch& b);

  absl::Status CopyEngine(const JobState& s, uint32_t begin, uint32_t end,
                          cudaStream_t stream = nullptr);

  void Complete(Batch& b);
  // A batch's timing events: one a completed batch gave back, else a new one (cudaEventCreate
  // is a driver call on every batch's path, which the first byte waits for). Dispatcher thread.
  absl::StatusOr<cuda::Event> TakeEvent();

  // Pinned plan-upload staging (CudaEngineOptions::staged_plan_upload; dispatcher only).
  struct StagingSlot {
    void* memory = nullptr;
    cuda::Event passed;  // recorded after the slot's latest upload
    bool recorded = false;
  };
  absl::Status MakeStaging();
  // A staging slot whose last upload the stream has passed (round robin), or nullptr when all
  // are still in use (the upload then goes unstaged).
  StagingSlot* TakeStaging();
  absl::Status PassedStaging(StagingSlot& slot);

  // The idle dispatcher spins up to dispatcher_spin_us for the next Enqueue before it sleeps on
  // mu_ (waking a sleeping thread costs tens of microseconds: a critical transfer's budget).
  void SpinForWork();

  const int device_;
  const CudaEngineOptions options_;
  // options_.critical_ctas resolved for this GPU (scheduler::ResolveCriticalCtas; 0: no raise).
  const int critical_ctas_;
  cuda::Stream stream_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool expect_ ABSL_GUARDED_BY(mu_) = false;  // Expect() since the dispatcher last woke
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
  std::string first_job_batches_ ABSL_GUARDED_BY(mu_);  // JobState::trace of the first job
  absl::Time last_enqueue_ ABSL_GUARDED_BY(mu_);
  size_t held_states_ ABSL_GUARDED_BY(mu_) = 0;  // states_.size(), for Describe
  uint64_t inflight_bytes_[kNumPriorityClasses] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  // GPU-side readiness wait: admitted jobs (AdmitGated) until their state is dropped.
  struct AdmittedGate {
    std::weak_ptr<Job> job;
    Job::ReadyGate gate;
  };
  // How many gated jobs this GPU holds: cuda_stream_wait_jobs, bounded by the hardware queues
  // CUDA_DEVICE_MAX_CONNECTIONS gives (read when the worker is made; scheduler::PlanGateQueues).
  const scheduler::GateQueuePlan gate_queues_ = scheduler::PlanGateQueues(
      options_.stream_wait_jobs,
      scheduler::HardwareQueuesFromEnv(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS")));
  scheduler::GateSlots gate_slots_ ABSL_GUARDED_BY(mu_){gate_queues_.max_jobs,
                                                        gate_queues_.reason};
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
  // Set by the first sticky CUDA error; every later batch fails with it.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // Dispatcher thread only (SweepLocked runs there too, under mu_ for the queue lookups).
  std::unordered_map<const Job*, std::unique_ptr<JobState>> states_;
  std::map<int, CtaTuner> tuners_;
  std::map<int, SplitTuner> split_tuners_;  // same keys as tuners_
  scheduler::CopyEngineCosts copy_costs_;   // written by WarmUp, read by SetUp (both dispatcher)
  bool first_job_text_pending_ = true;
  absl::Time first_launch_from_;
  std::optional<cuda::Stream> copy_stream_;  // the copy-engine part of split batches
  int gated_pending_ = 0;  // gated batches launched and not completed (dispatcher only)
  std::deque<int> free_abort_slots_;  // word pairs of the abort page not in use (dispatcher)
  uint32_t gate_epoch_ = 0;
  // The gated jobs' stream pairs (MakeGateStreams) and the free ones (dispatcher only).
  struct GateStreams {
    cuda::Stream copy;
    cuda::Stream abort;
  };
  std::vector<GateStreams> gate_pool_;
  std::deque<int> free_gate_streams_;
  std::vector<CopyRun> runs_;
  std::vector<cuda::Event> spare_events_;  // TakeEvent's (dispatcher only; at most 8)
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
  // Pinned plan-upload staging (MakeStaging; dispatcher only).
  void* staging_memory_ = nullptr;
  std::vector<StagingSlot> staging_;
  size_t next_staging_ = 0;
  // Set by Enqueue, cleared by the dispatcher before its idle spin.
  std::atomic<bool> work_hint_{false};

};

}  // namespace kvrail::engine::cuda_detail
