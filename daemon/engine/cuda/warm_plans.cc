#include "daemon/engine/cuda/warm_plans.h"

#include <utility>

namespace kvrail::engine::cuda_detail {

std::optional<WarmPlans::Kept> WarmPlans::Take(const std::string& key) {
  // The most recently given back first (a few dozen entries at most: a walk is cheap).
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->ticket.key != key) continue;
    if (!ops_->Passed(*it->ticket.released)) continue;  // its last holder's kernels may still read
    Kept out = std::move(*it);
    Erase(it);
    return out;
  }
  return std::nullopt;
}

void WarmPlans::Give(Ticket ticket, std::unique_ptr<GpuPlan> plan) {
  if (!enabled() || plan == nullptr || ticket.bytes > limits_.max_bytes) return;
  if (ticket.released == nullptr) {
    absl::StatusOr<std::unique_ptr<GpuEvent>> event = ops_->CreateEvent();
    if (!event.ok()) return;
    ticket.released = *std::move(event);
  }
  if (!ops_->Record(*ticket.released, ops_->main_stream()).ok()) return;
  bytes_ += ticket.bytes;
  lru_.push_front(Kept{std::move(plan), std::move(ticket)});
  while (!lru_.empty() && (lru_.size() > limits_.max_entries || bytes_ > limits_.max_bytes)) {
    Erase(std::prev(lru_.end()));
  }
}

void WarmPlans::Clear() {
  lru_.clear();
  bytes_ = 0;
}

void WarmPlans::Erase(Lru::iterator it) {
  bytes_ -= it->ticket.bytes;
  lru_.erase(it);
}

}  // namespace kvrail::engine::cuda_detail
