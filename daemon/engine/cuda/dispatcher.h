// One GPU's dispatcher: takes batches from the DispatchQueues, sets each job up (device
// addresses, mode, plan upload, the gate), launches its batches through GpuOps, completes them
// in order and reports their tiles, and drops the states of jobs that ended. Its definitions are
// dispatcher.cc (the loop, set-up, sweep) and dispatcher_launch.cc (launch and completion).
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/predictive_wake.h"
#include "base/spin_budget.h"
#include "daemon/engine/cuda/cuda_engine_options.h"
#include "daemon/engine/cuda/dispatch_queues.h"
#include "daemon/engine/cuda/gpu_gate.h"
#include "daemon/engine/cuda/gpu_ops.h"
#include "daemon/engine/cuda/plan_stager.h"
#include "daemon/engine/cuda/tuners.h"
#include "daemon/engine/cuda/warm_plans.h"
#include "daemon/engine/cuda/worker_stats.h"
#include "daemon/engine/engine.h"
#include "daemon/scheduler/cuda_batch_policy.h"

namespace kvrail::engine::cuda_detail {

constexpr size_t kMaxInFlight = 2;  // batches queued on the stream: the next launch hides the gap
// CTAs of the digest's hash-only kernels after a copy-engine batch (spec.digest).
constexpr int kDigestCtas = 16;
// Tuner keys of the copy-only mode's small kernels start here (CtaTunerKey stays below 200).
constexpr int kCopyOnlyTunerKeys = 1 << 10;
// While gated copies wait, the dispatcher looks at their producers' words this often: a batch
// whose words have come is completed by a blocking event wait (its kernel started on the GPU at
// the word). No host function wakes it: a host callback after each gated batch put a CPU round
// trip between one layer's copy and the next on the job's stream (docs/benchmarks.md).
constexpr absl::Duration kGateWordPoll = absl::Microseconds(20);
// The idle spin's budget window (CudaEngineOptions::dispatcher_spin_budget): the most unused
// budget banked is the share of this.
constexpr absl::Duration kIdleSpinBudgetWindow = absl::Milliseconds(100);

// How a job's plan runs on this GPU (scheduler::ChoosePlanMode's choice and what follows).
struct PlanRun {
  scheduler::Mode mode = scheduler::Mode::kKernel;
  int max_ctas = 0;  // kernel: the most CTAs a launch may use
  int tuner_key = 0;
  bool copy_only_kernel = false;  // the copy-engine-only mode's small kernel
  // Kernel batches may hand their last tiles to the copy engines (the SplitTuner of tuner_key).
  bool may_split = false;
  double copy_gbps_prior = 0;  // EstimateCopyEngineGbps of the plan's runs
  bool split_said = false;     // OnEngineUsed("cuda-copy-engine") sent for a split batch
};

// Where a job's running time went (GPU time of its batches against the wall time from its first
// launch), and for the daemon's first job its set-up phases and batch trace.
struct JobProgress {
  std::optional<absl::Time> first_launch;
  double gpu_seconds = 0;
  uint64_t bytes_done = 0;
  uint32_t batches = 0;
  uint64_t last_batch_bytes = 0;           // of the latest batch launched (the ramp)
  std::unique_ptr<GpuEvent> trace_anchor;  // first job only: before its first batch
  std::string trace;
  absl::Duration setup_addresses, setup_mode, setup_upload;
  // First job, first batch only: when each step of its enqueue ended (MarkFirstBatch), so a slow
  // first launch names the step that was slow.
  bool marking = false;
  std::vector<std::pair<const char*, absl::Time>> first_batch_marks;
};

struct JobState;

// A taken batch once launched (or failed to launch).
struct Batch {
  JobState* state = nullptr;
  Taken taken;
  int ctas = 0;  // 0: copy engines
  scheduler::LaunchCtas chosen;
  double enqueued_us = -1;  // first job only: launch enqueued, us after its first launch
  std::unique_ptr<GpuEvent> start, stop;
  // Kernel and copy engines together: tiles [split, end) ran on the copy engines beside the
  // kernel's [begin, split); each part's end is timed from `start`.
  uint32_t split = 0;
  bool split_sampled = false;
  std::unique_ptr<GpuEvent> kernel_done, copy_done;
  absl::Status launch;
  // Something of the batch reached a stream (a wait, a kernel, copies) before the launch failed:
  // its tiles report only once the streams passed it, so nothing still writes them (`fenced`:
  // `stop` was recorded after it; else the streams are synchronized).
  bool enqueued = false;
  bool copy_enqueued = false;
  bool fenced = false;
  GpuStream* stream = nullptr;
};

// What the dispatcher knows about a job it has started (dispatcher thread only).
struct JobState {
  std::shared_ptr<Job> job;
  absl::Status setup;  // not OK: every tile of the job fails with it
  PlanRun run;
  uint8_t* src = nullptr;  // device-visible bases (nullptr for per-layer sides)
  uint8_t* dst = nullptr;
  // Per-layer sides: the plan with the layers' addresses on this GPU.
  std::optional<planner::Plan> device_plan;
  const planner::Plan& RunPlan() const { return device_plan ? *device_plan : job->plan(); }
  std::unique_ptr<GpuPlan> plan;
  // `plan` goes back to the warm plans when the state is dropped (not for gated jobs).
  std::optional<WarmPlans::Ticket> warm;
  std::unique_ptr<GpuDigests> digests;  // spec.digest
  // Tables uploaded from pinned memory are read after SetUp returns: held until `uploaded` has
  // passed (waited for when the state is dropped).
  std::unique_ptr<GpuEvent> uploaded;
  std::shared_ptr<const void> src_tables, dst_tables;
  int in_flight = 0;
  JobProgress progress;
  // The GPU-written completion: stored by the stream after the batch that launches the job's last
  // tile, when every batch of the job launched and the job has not ended (DoneWordDue).
  std::optional<DoneWord> done_word;
  std::shared_ptr<const void> done_keep;  // the word's mapping, until the state is dropped
  uint32_t tiles_launched = 0;            // of batches enqueued whole
  bool launch_failed = false;             // a batch of the job failed to launch (or never launched)
  // GPU-side readiness wait: the batches run on the lease's stream behind the layers' words and
  // complete out of the in-flight pipeline (`gated`, oldest first).
  std::optional<Job::ReadyGate> gate;
  GateLease lease;
  std::list<Batch> gated;
};

// Thread contract: the dispatcher thread only (Serve, or a test's thread calling Turn); it uses
// the queues, the gate and the stats, which are thread-safe.
class Dispatcher {
 public:
  Dispatcher(GpuOps* ops, const Clock* clock, const CudaEngineOptions& options, int critical_ctas,
             DispatchQueues* queues, GpuGate* gate, WorkerStats* stats);
  ~Dispatcher();

  Tuners& tuners() { return tuners_; }
  PlanStager& stager() { return stager_; }
  const WarmPlans& warm_plans() const { return warm_; }

  // One turn of the loop: completes what is due, takes and launches the next batch, drops the
  // states of ended jobs. `block`: waits (idle spin, then sleep) for work when there is none.
  // False once the queues were stopped.
  bool Turn(bool block);
  // After the last turn: gated copies still waiting are released by the watchdog (the gate is
  // told the engine stops), bounded; every gate is retired and reaped.
  void Finish();

  // The serving loop: Turn(true) until stopped, then Finish.
  void Serve();

  // Before serving: the copy-engine part's stream (made lazily otherwise, after the gate's).
  absl::Status MakeCopyStream() { return CopyStream().status(); }

  size_t states() const { return states_.size(); }
  int gated_pending() const { return gated_pending_; }

  scheduler::ModeInputs ModeInputsFor(const Job& job, bool peer_unreachable) const;

 private:
  JobState& StateFor(const std::shared_ptr<Job>& job);
  absl::Status SetUp(JobState& s);
  // `keep`: the plan may come from (and go back to) the warm plans.
  absl::Status UploadPlan(JobState& s, bool keep);
  // A kept plan of the job's shape with the job's ids written into it; nullptr when none is kept
  // or its ids could not be written (that buffer is then dropped).
  std::unique_ptr<GpuPlan> TakeWarm(JobState& s, const std::string& key);
  // Pinned tables read later in stream order (an unstaged upload): held until `uploaded` passed.
  absl::Status HoldTables(JobState& s);

  // Drops the states of jobs with nothing queued or running that will get no more tiles: chosen
  // under the queue lock, let go after it (gates retired, references dropped, outside locks).
  void Sweep();
  void Drop(std::unique_ptr<JobState> state);
  void DropIfFinished(JobState* s);

  Batch Launch(JobState& s, const Taken& taken);
  Batch LaunchBatch(JobState& s, const Taken& taken);
  absl::Status EnqueueBatch(JobState& s, Batch& b);
  absl::Status LaunchCopyPart(const JobState& s, Batch& b);
  absl::Status CopyRuns(const JobState& s, uint32_t begin, uint32_t end, GpuStream& stream);
  absl::Status DigestBatch(JobState& s, uint32_t begin, uint32_t end, int ctas);
  // After a batch's work is enqueued, before its `stop`: the job's done word when this batch
  // holds its last tile and nothing of the job failed. Never fails the batch (the client then
  // reads the daemon's completion, as without the word).
  void MaybeWriteDoneWord(JobState& s, uint32_t batch_tiles, GpuStream& stream);
  // After a failed launch that left work on the streams: `stop` recorded behind it.
  void Fence(Batch& b);
  void Complete(Batch& b);
  void Learn(JobState& s, Batch& b, double seconds);
  void PollGated();
  bool GateWordsCame(const JobState& s, const Batch& b) const;
  absl::StatusOr<GpuStream*> CopyStream();
  absl::StatusOr<std::unique_ptr<GpuEvent>> TakeEvent();
  // The idle spin: polls the queues' hint for up to options_.dispatcher_spin_us, as long as
  // idle_budget_ allows, reading the injected clock; charges what it spun to the budget.
  void SpinForWork();
  // Polls the queues' hint from `from` until `until` (yielding each round when `yield`); the
  // clock's reading when it ended and whether work came.
  std::pair<absl::Time, bool> PollHint(absl::Time from, absl::Time until, bool yield);
  // Predictive wake (options_.predictive_wake), before the idle sleep: at a steady job cadence a
  // timed sleep until the next job's window, then a spin on the hint through it, drawn from
  // idle_budget_. False once the queues were stopped.
  bool AwaitPredicted();

  GpuOps* const ops_;
  const Clock* const clock_;
  const CudaEngineOptions options_;
  const int critical_ctas_;  // options_.critical_ctas resolved for this GPU (0: no raise)
  DispatchQueues* const queues_;
  GpuGate* const gate_;
  WorkerStats* const stats_;
  PlanStager stager_;
  WarmPlans warm_;
  Tuners tuners_;
  SpinBudget idle_budget_;
  PredictiveWake wake_;
  std::unordered_map<const Job*, std::unique_ptr<JobState>> states_;
  std::deque<Batch> in_flight_;
  int gated_pending_ = 0;                                // gated batches launched and not completed
  std::unique_ptr<GpuStream> copy_stream_;               // the copy-engine part of split batches
  std::vector<std::unique_ptr<GpuEvent>> spare_events_;  // at most 8
  std::vector<scheduler::CopyRun> runs_;
};

}  // namespace kvrail::engine::cuda_detail
