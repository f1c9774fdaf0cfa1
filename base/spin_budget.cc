#include "base/spin_budget.h"

#include <algorithm>
#include <cstdint>

namespace kvrail {

SpinBudget::SpinBudget(double share, absl::Duration window, absl::Time start)
    : share_(std::clamp(share, 0.0, 1.0)),
      cap_(std::max(window, absl::Nanoseconds(1)) * share_),
      tokens_(cap_),
      filled_at_(start) {}

namespace {

// `d` * `share` to the nanosecond: absl's Duration * double scales with 128-bit care (modf and
// all), a cost the session poll thread paid on every round of its spin.
absl::Duration Scaled(absl::Duration d, double share) {
  return absl::Nanoseconds(
      static_cast<int64_t>(static_cast<double>(absl::ToInt64Nanoseconds(d)) * share));
}

}  // namespace

void SpinBudget::Refill(absl::Time now) {
  if (now <= filled_at_) return;
  tokens_ = std::min(cap_, tokens_ + Scaled(now - filled_at_, share_));
  filled_at_ = now;
}

bool SpinBudget::Allows(absl::Time now) {
  if (share_ >= 1.0) return true;
  Refill(now);
  if (tokens_ - held_ > absl::ZeroDuration()) return true;
  ++refusals_;
  return false;
}

absl::Duration SpinBudget::Allowance(absl::Time now) {
  if (share_ >= 1.0) return absl::InfiniteDuration();
  Refill(now);
  const absl::Duration left = tokens_ - held_;
  if (left <= absl::ZeroDuration()) {
    ++refusals_;
    return absl::ZeroDuration();
  }
  return absl::Nanoseconds(absl::ToDoubleNanoseconds(left) / (1.0 - share_));
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
    tokens_ += Scaled(to - filled_at_, share_);
    filled_at_ = to;
  }
  tokens_ = std::min(tokens_, cap_);
}

void SpinBudget::Held(absl::Time from, absl::Time to) {
  if (to > from) held_ += to - from;
}

void SpinBudget::Found(absl::Duration free) {
  const absl::Duration released = std::min(held_, std::max(free, absl::ZeroDuration()));
  released_ += released;
  held_ -= released;
  Settle();
}

absl::Duration SpinBudget::Settle() {
  const absl::Duration drawn = held_;
  held_ = absl::ZeroDuration();
  spent_ += drawn;
  // The refill of the held rounds' own time was added (capped) as Allows read the clock: a spin
  // from a full bucket is charged its whole length, not (1 - share) of it as Spent does.
  if (share_ < 1.0) tokens_ -= drawn;
  return drawn;
}

absl::Duration NextSpin(absl::Duration max, absl::Duration current, absl::Duration waited) {
  if (max <= absl::ZeroDuration()) return absl::ZeroDuration();
  if (waited <= max) return max;
  return std::max(max / 8, current / 2);
}

}  // namespace kvrail
