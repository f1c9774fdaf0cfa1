#include "base/spin_budget.h"

#include <algorithm>

namespace kvrail {

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

absl::Duration SpinBudget::Allowance(absl::Time now) {
  if (share_ >= 1.0) return absl::InfiniteDuration();
  Refill(now);
  if (tokens_ <= absl::ZeroDuration()) {
    ++refusals_;
    return absl::ZeroDuration();
  }
  return absl::Nanoseconds(absl::ToDoubleNanoseconds(tokens_) / (1.0 - share_));
}

void SpinBudget::Spent(absl::Time from, absl::Time to) {
  if (to <= from) return;
  spent_ += to - from;
  if (share_ >= 1.0) return;
  Refill(from);  // the time before the spin, capped
  // While it spins the bucket drains at 1 and fills at `share`: it only falls, so the refill of
  // the spin's own time is never lost to the cap (a long spin from a full bucket is charged
  // (1 - share) of its length, as Allowance assumes).
  tokens_ -= to - from;
  if (to > filled_at_) {
    tokens_ += (to - filled_at_) * share_;
    filled_at_ = to;
  }
  tokens_ = std::min(tokens_, cap_);
}

}  // namespace kvrail
