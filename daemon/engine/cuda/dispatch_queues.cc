#include "daemon/engine/cuda/dispatch_queues.h"

#include <algorithm>
#include <utility>

#include "daemon/scheduler/cuda_batch_policy.h"

namespace kvrail::engine::cuda_detail {

namespace {

// Bytes of the tiles from `first` to the end of its layer.
uint64_t LayerBytesFrom(const planner::Plan& plan, uint32_t first) {
  const uint32_t layer = plan.tile(first).layer;
  uint64_t bytes = 0;
  for (uint32_t t = first; t < plan.num_tiles() && plan.tile(t).layer == layer; ++t) {
    bytes += plan.tile(t).bytes;
  }
  return bytes;
}

}  // namespace

void DispatchQueues::Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) {
  absl::MutexLock lock(&mu_);
  queues_.Add(job, tiles);
  last_enqueue_ = clock_->Now();
  hint_.store(true, std::memory_order_release);  // ends the dispatcher's idle spin
}

size_t DispatchQueues::Remove(const Job* job) {
  absl::MutexLock lock(&mu_);
  return queues_.Remove(job);
}

void DispatchQueues::FinishStartedFirst() {
  absl::MutexLock lock(&mu_);
  queues_.FinishStartedFirst();
}

void DispatchQueues::AddQueued(std::vector<uint64_t>* out) const {
  absl::MutexLock lock(&mu_);
  queues_.AddCounts(out);
}

void DispatchQueues::Expect() {
  absl::MutexLock lock(&mu_);
  expect_ = true;
}

void DispatchQueues::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  hint_.store(true, std::memory_order_release);
}

bool DispatchQueues::stopped() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

bool DispatchQueues::AwaitWork(std::optional<absl::Duration> timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Condition work(this, &DispatchQueues::HasWorkOrStop);
  if (timeout.has_value()) {
    mu_.AwaitWithTimeout(work, *timeout);
  } else {
    mu_.Await(work);
  }
  expect_ = false;  // woken for it: the idle spin waits for its Enqueue
  return !stop_;
}

bool DispatchQueues::ClearHintUnlessWork() {
  absl::MutexLock lock(&mu_);
  if (HasWorkOrStop()) return true;
  hint_.store(false, std::memory_order_relaxed);
  return false;
}

std::optional<Taken> DispatchQueues::Take(absl::FunctionRef<bool(const Job&)> layer_batches,
                                          absl::FunctionRef<uint64_t(const Job&)> previous_bytes) {
  absl::MutexLock lock(&mu_);
  for (int c = 0; c < kNumPriorityClasses; ++c) {
    if (queues_.Empty(c)) continue;
    const ClassLimits& limit = limits_[c];
    if (!scheduler::MayStart(limit, inflight_bytes_[c], queues_.FrontTileBytes(c))) continue;
    const uint64_t budget = scheduler::ClassBatchBytes(
        scheduler::BatchBytesFor(c == static_cast<int>(PriorityClass::kBackground), batch_bytes_),
        limit.max_inflight_bytes, inflight_bytes_[c]);
    auto [job, batch] = queues_.TakeFrom(c, [&](const Job& j, scheduler::TileRanges& tiles) {
      const uint64_t previous = previous_bytes(j);
      if (layer_batches(j)) {  // one layer per batch: each waits on its own word
        return scheduler::TakeJobBatch(
            &tiles, j.plan(), std::min(budget, LayerBytesFrom(j.plan(), tiles.front())), previous);
      }
      return scheduler::TakeJobBatch(&tiles, j.plan(), budget, previous);
    });
    Taken taken{
        std::move(job), c, batch.begin, batch.end, 0, batch.ramped, clock_->Now() - last_enqueue_};
    for (uint32_t t = taken.begin; t < taken.end; ++t) {
      taken.bytes += taken.job->plan().tile(t).bytes;
    }
    inflight_bytes_[c] += taken.bytes;
    return taken;
  }
  return std::nullopt;
}

void DispatchQueues::Done(int cls, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  inflight_bytes_[cls] -= bytes;
}

std::vector<const Job*> DispatchQueues::SelectIdle(const std::vector<const Job*>& jobs,
                                                   absl::FunctionRef<bool(const Job*)> idle) {
  std::vector<const Job*> out;
  absl::MutexLock lock(&mu_);
  for (const Job* job : jobs) {
    if (!queues_.Contains(job) && idle(job)) out.push_back(job);
  }
  return out;
}

bool DispatchQueues::HeldForTest() const {
  if (!mu_.TryLock()) return true;
  mu_.Unlock();
  return false;
}

}  // namespace kvrail::engine::cuda_detail
