// The CUDA engine's per-GPU tile queues: what Enqueue hands in and the dispatcher takes out, in
// the scheduler's order (//daemon/scheduler:tile_queues, cuda_batch_policy), with the bytes each
// priority class has in flight. Holds nothing but the queues.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/engine/engine.h"
#include "daemon/scheduler/tile_queues.h"

namespace kvrail::engine::cuda_detail {

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

// Thread contract: every method from any thread. The queues are touched only under mu_, which
// is held across nothing but the callbacks named below (no GPU call, no lock but the gate's
// admission lock, no reference dropped).
class DispatchQueues {
 public:
  DispatchQueues(const PriorityLimits& limits, uint64_t batch_bytes, const Clock* clock)
      : limits_(limits), batch_bytes_(batch_bytes), clock_(clock) {}

  void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles);
  size_t Remove(const Job* job);
  void FinishStartedFirst();
  void AddQueued(std::vector<uint64_t>* out) const;
  // Engine::Expect: a sleeping dispatcher wakes (AwaitWork returns) for the job being planned.
  void Expect();
  void Stop();
  bool stopped() const;

  // The dispatcher's idle wait: until work, Expect or Stop (or `timeout`, when given). Clears
  // the Expect. False once stopped.
  bool AwaitWork(std::optional<absl::Duration> timeout);
  // Whether work came (or Stop) since the hint was cleared: the idle spin's lock-free look.
  bool hint() const { return hint_.load(std::memory_order_acquire); }
  // Clears the hint unless there is work or a stop already (then true: do not spin).
  bool ClearHintUnlessWork();

  // The next batch in priority order that its class's byte limit allows, or nothing; its bytes
  // count as in flight until Done. Under mu_: `layer_batches(job)`, whether the job's batches
  // stop at the end of a layer (a gated job's: each layer waits on its own word), and
  // `previous_bytes(job)`, the job's latest batch's bytes (the ramp).
  std::optional<Taken> Take(absl::FunctionRef<bool(const Job&)> layer_batches,
                            absl::FunctionRef<uint64_t(const Job&)> previous_bytes);
  // A taken batch's tiles were reported: its bytes leave the class's in-flight count.
  void Done(int cls, uint64_t bytes);

  // Of `jobs`, those with no queued tile for which `idle` says yes; `idle` runs under mu_, so no
  // Enqueue interleaves with the decision.
  std::vector<const Job*> SelectIdle(const std::vector<const Job*>& jobs,
                                     absl::FunctionRef<bool(const Job*)> idle);

  // Tests: whether mu_ is held now.
  bool HeldForTest() const;

 private:
  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || expect_ || !queues_.AllEmpty();
  }

  const PriorityLimits limits_;
  const uint64_t batch_bytes_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool expect_ ABSL_GUARDED_BY(mu_) = false;  // Expect() since the dispatcher last woke
  scheduler::TileQueues queues_ ABSL_GUARDED_BY(mu_){scheduler::WithinClass::kFewestTilesFirst};
  absl::Time last_enqueue_ ABSL_GUARDED_BY(mu_);
  uint64_t inflight_bytes_[kNumPriorityClasses] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  std::atomic<bool> hint_{false};  // set by Enqueue and Stop, cleared before the idle spin
};

}  // namespace kvrail::engine::cuda_detail
