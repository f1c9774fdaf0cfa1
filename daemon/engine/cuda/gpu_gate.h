// The CUDA engine's GPU-side readiness wait (CudaEngineOptions::stream_wait; the policy is
// scheduler/stream_gate.h): admission, the abort page, the pool of stream pairs gated jobs wait
// on, arming a job's abort stream, and the watchdog that releases pending waits with CPU stores.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/engine/cuda/gpu_ops.h"
#include "daemon/engine/engine.h"
#include "daemon/scheduler/stream_gate.h"

namespace kvrail::engine::cuda_detail {

// Abort/done word pairs in the gate's mapped abort page (slots reused oldest-freed first).
constexpr int kGateWordPairs = 512;
// After a job ended, its waits are released this long later at the latest (DecideGateRelease).
constexpr absl::Duration kGateReleaseGrace = absl::Seconds(1);
// The watchdog's tick.
constexpr absl::Duration kGateWatchTick = absl::Microseconds(500);

inline bool Reached(uint32_t word, uint32_t value) {
  return static_cast<int32_t>(word - value) >= 0;
}

// One gated job's release state, shared by the dispatcher (set-up, launches, completions) and
// the watchdog, which decides (scheduler::DecideGateRelease) and releases with CPU stores only:
// it raises the abort word, and once the done word shows (the job's abort stream, armed at
// set-up behind a wait on the abort word, has then zeroed the plan's tile count on the GPU) it
// raises the producer's unwritten words, so the pending waits pass and the disarmed kernels
// store nothing. No GPU call, so a release cannot block behind the waits it is meant to end.
// Thread-safe (mu; `armed` and `launched_end` atomic; the rest immutable once registered).
struct GateControl {
  // Held until the gate's reaper drops the control, so no watchdog look ever drops the job's
  // (or the flag words', `gate.keep`) last reference.
  std::shared_ptr<Job> job;
  Job::ReadyGate gate;
  uint32_t* abort_word = nullptr;  // host addresses in the abort page
  const uint32_t* done_word = nullptr;
  uint32_t epoch = 0;  // the abort stream waits for abort_word >= epoch, writes done = epoch
  int slot = -1;
  std::atomic<bool> armed{false};
  std::atomic<uint32_t> launched_end{0};  // layers [0, launched_end) have their waits enqueued
  absl::Mutex mu;
  bool aborted ABSL_GUARDED_BY(mu) = false;   // no kernel of the job copies any more
  bool fired ABSL_GUARDED_BY(mu) = false;     // abort word stored
  bool released ABSL_GUARDED_BY(mu) = false;  // the producer's words raised
  bool retired ABSL_GUARDED_BY(mu) = false;   // the dispatcher let it go: the watchdog skips it
  absl::Status end ABSL_GUARDED_BY(mu);
  std::optional<absl::Time> ended_seen ABSL_GUARDED_BY(mu);

  bool Aborted(absl::Status* why) {
    absl::MutexLock lock(&mu);
    if (aborted && why != nullptr) *why = end;
    return aborted;
  }
  // Stores the abort word (once, when armed).
  void FireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (fired || !armed.load(std::memory_order_acquire)) return;
    __atomic_store_n(abort_word, epoch, __ATOMIC_RELEASE);
    fired = true;
  }
};

// What a gated job holds of the gate from Arm to Retire (dispatcher thread only).
struct GateLease {
  int pair = -1;                // the stream pair's index in the pool
  GpuStream* stream = nullptr;  // the job's batches wait and run here
  std::shared_ptr<GateControl> control;
  std::unique_ptr<GpuEvent> uploaded;    // after the plan's upload on the main stream
  std::unique_ptr<GpuEvent> abort_done;  // after the abort stream's last op
};

struct GateOptions {
  bool enabled = false;  // CudaEngineOptions::stream_wait
  int max_jobs = 0;      // scheduler::PlanGateQueues
  std::string queue_limit;
  int sync_bound_ms = 1000;  // CudaEngineOptions::stream_wait_sync_bound_ms
  // How long a context-synchronizing call has been blocked (nullopt: none is); the real one is
  // base/cuda/context_sync.h's OldestContextSync.
  std::function<std::optional<std::pair<absl::Duration, std::string>>(absl::Time now)> blocked_sync;
};

// Thread contract: Admit, Admitted, Forget, SweepAdmitted, Text from any thread (mu_); Make,
// Arm, Retire and Reap on the dispatcher thread; WatchOnce on the watchdog thread (Start) or a
// test's. Lock order: the dispatcher's queue lock, then mu_, then a GateControl's mu; none is
// held across a GPU call, and no reference to a job or its flag words is dropped under any.
class GpuGate {
 public:
  GpuGate(GpuOps* ops, const Clock* clock, GateOptions options);
  ~GpuGate();  // stops the watchdog
  GpuGate(const GpuGate&) = delete;
  GpuGate& operator=(const GpuGate&) = delete;

  // Before serving (cudaHostAlloc may synchronize the context, which must not happen while a
  // wait is pending): the stream pairs (each parked wait on a hardware queue of its own) and the
  // abort page. Without them, Admit says no.
  absl::Status Make();
  // Starts the watchdog thread (a tick every kGateWatchTick).
  void Start();

  // The admission decision (scheduler::GateSlots) for `job`, whose `gate` the caller read;
  // `in` carries the plan's facts (flags_mapped, kernel_mode, digest).
  bool Admit(const std::shared_ptr<Job>& job, Job::ReadyGate gate, scheduler::GateInputs in);
  std::optional<Job::ReadyGate> Admitted(const Job* job) const;
  bool IsAdmitted(const Job* job) const;
  // The job's state is gone: its admission (and slot) too; the entry itself goes at Reap.
  void Forget(const Job* job);
  // Admitted jobs that ended before they started give their slots back.
  void SweepAdmitted();

  // Set-up of an admitted job, after its plan's upload on the main stream: a stream pair, an
  // abort word pair, and the abort stream armed (it waits for the abort word, then zeroes the
  // plan's tile count and writes the done word). Registered with the watchdog once armed. A
  // lease that comes back with an error still goes to Retire.
  absl::Status Arm(GateLease& lease, const std::shared_ptr<Job>& job, const Job::ReadyGate& gate,
                   GpuPlan& plan);
  // The job's state is going (dispatcher, no lock held): its abort stream fires, the main stream
  // waits for it (so the plan's stream-ordered free follows it), the watchdog stops looking at
  // it, the pair and word slot go back. The control's last reference goes at Reap.
  void Retire(GateLease& lease);
  // Drops retired controls nobody else holds (dispatcher, no lock held): the job and its flag
  // words' last references go here, never on the watchdog.
  void Reap();

  // The dispatcher's heartbeat, and its stop (then every pending wait is released).
  void Beat() { beat_ns_.store(absl::ToUnixNanos(clock_->Now()), std::memory_order_relaxed); }
  void Stopping() { stopping_.store(true); }

  // One watchdog tick: each armed job's release decision, and the release where it says so.
  void WatchOnce();

  std::string Text() const;
  bool ready() const;  // the abort page and the word ops exist
  uint64_t releases() const;

 private:
  void WatchOne(GateControl& c, absl::Time now,
                const std::optional<std::pair<absl::Duration, std::string>>& sync,
                absl::Duration silent);
  // Disarms the job's kernels (abort word, then the abort stream's done word), then raises its
  // producer's unwritten words. False while the done word has not shown.
  bool Release(GateControl& c, const absl::Status& why, uint32_t* raised);

  struct Pair {
    std::unique_ptr<GpuStream> copy, abort;
  };
  struct AdmittedGate {
    std::weak_ptr<Job> job;
    Job::ReadyGate gate;
  };

  GpuOps* const ops_;
  const Clock* const clock_;
  const GateOptions options_;
  mutable absl::Mutex mu_;
  scheduler::GateSlots slots_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<const Job*, AdmittedGate> admitted_ ABSL_GUARDED_BY(mu_);
  std::vector<AdmittedGate> forgotten_ ABSL_GUARDED_BY(mu_);  // to reap
  std::string last_choice_ ABSL_GUARDED_BY(mu_);
  uint64_t releases_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bound_releases_ ABSL_GUARDED_BY(mu_) = 0;  // of them, for a blocked call
  std::unique_ptr<HostMemory> page_ ABSL_GUARDED_BY(mu_);
  std::deque<int> free_slots_ ABSL_GUARDED_BY(mu_);
  uint32_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Pair> pairs_ ABSL_GUARDED_BY(mu_);
  std::deque<int> free_pairs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<GateControl>> controls_ ABSL_GUARDED_BY(mu_);  // watched
  std::vector<std::shared_ptr<GateControl>> retired_ ABSL_GUARDED_BY(mu_);   // to reap
  std::atomic<int64_t> beat_ns_{0};
  std::atomic<bool> stopping_{false};
  bool watch_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

}  // namespace kvrail::engine::cuda_detail
