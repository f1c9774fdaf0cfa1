#include "daemon/session/spin_budget.h"

#include <algorithm>

namespace kvrail::session {

SpinBudget::SpinBudget(double share, absl::Duration window, absl::Time start)
    : share_(std::clamp(share, 0.0, 1.0)),
      cap_(std::max(window, absl::Nanoseconds(1)) * share_),
      tokens_(cap_),
      filled_at_(start) {}

void SpinBudget::Refill(absl::Time now) {
  if (now <= filled_at_) return;
  tokens_ = std::min(cap_, tokens_ + (now - filled_at_) * share_);
  filled_at_ = now;
}

bool SpinBudget::Allows(absl::Time now) {
  if (share_ >= 1.0) return true;
  Refill(now);
  if (tokens_ > absl::ZeroDuration()) return true;
  ++refusals_;
  return false;
}

void SpinBudget::Spent(absl::Time from, absl::Time to) {
  if (to <= from) return;
  spent_ += to - from;
  if (share_ >= 1.0) return;
  Refill(to);
  tokens_ -= to - from;
}

}  // namespace kvrail::session
