#include "base/predictive_wake.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvrail {
namespace {

absl::Duration Median(std::vector<absl::Duration> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  return v[mid];
}

// A plan's spin (from the wake-up, i.e. the timed sleep's deadline plus its overshoot, to the
// spin's end) may be at most this share of the gap: beyond it the spin costs more than a quarter
// of a core and the cadence is too loose to predict. The overshoot is not counted: the thread is
// waking then, not spinning (150-190 us on a host in deep idle states).
constexpr double kMaxWindowShare = 0.25;
// Jitter above this share of the gap: irregular.
constexpr double kMaxJitterShare = 0.1;

}  // namespace

void PredictiveWake::Arrived(absl::Time at) {
  if (at < last_arrival_) at = last_arrival_;
  missed_ = false;
  if (last_arrival_ != absl::InfinitePast() && at - last_arrival_ < options_.burst) {
    last_arrival_ = at;  // the same burst
    return;
  }
  if (burst_start_ != absl::InfinitePast()) {
    const absl::Duration gap = at - burst_start_;
    if (gap > options_.max_gap) {
      gap_count_ = 0;  // a pause: what came before is no cadence of what comes next
    } else {
      gaps_[gap_count_ % kGaps] = gap;
      ++gap_count_;
    }
  }
  burst_start_ = at;
  last_arrival_ = at;
}

void PredictiveWake::Woke(absl::Time asked, absl::Time woke) {
  overshoots_[overshoot_count_ % kOvershoots] = std::max(woke - asked, absl::ZeroDuration());
  ++overshoot_count_;
}

void PredictiveWake::Missed() {
  missed_ = true;
  ++misses_;
}

absl::Duration PredictiveWake::gap() const {
  if (gap_count_ < kMinGaps) return absl::ZeroDuration();
  const size_t n = std::min(gap_count_, kGaps);
  return Median(std::vector<absl::Duration>(gaps_.begin(), gaps_.begin() + n));
}

absl::Duration PredictiveWake::jitter() const { return JitterAround(gap()); }

absl::Duration PredictiveWake::JitterAround(absl::Duration median) const {
  if (median == absl::ZeroDuration()) return absl::ZeroDuration();
  const size_t n = std::min(gap_count_, kGaps);
  std::vector<absl::Duration> deviations;
  deviations.reserve(n);
  for (size_t i = 0; i < n; ++i) deviations.push_back(absl::AbsDuration(gaps_[i] - median));
  return Median(std::move(deviations));
}

absl::Duration PredictiveWake::overshoot() const {
  if (overshoot_count_ == 0) return kInitialOvershoot;
  // The second largest of the latest (about their 90th percentile): one late wake-up does not
  // move the window, a slower machine does.
  const size_t n = std::min(overshoot_count_, kOvershoots);
  std::vector<absl::Duration> v(overshoots_.begin(), overshoots_.begin() + n);
  std::sort(v.begin(), v.end());
  return v[n >= 2 ? n - 2 : 0];
}

PredictiveWake::Plan PredictiveWake::Next(absl::Time now) const {
  Plan plan;
  if (missed_) return plan;
  const absl::Duration cadence = gap();
  if (cadence == absl::ZeroDuration()) return plan;
  const absl::Duration spread = JitterAround(cadence);
  if (spread > cadence * kMaxJitterShare) return plan;
  const absl::Time arrival = burst_start_ + cadence;
  const absl::Time wake_at = arrival - options_.margin - overshoot();
  const absl::Time spin_until = arrival + options_.tolerance + 3 * spread;
  if (spin_until - (arrival - options_.margin) > cadence * kMaxWindowShare) return plan;
  if (spin_until <= now) return plan;  // past its window already (the thread was busy)
  plan.predicted = true;
  plan.wake_at = wake_at;
  plan.spin_until = spin_until;
  return plan;
}

absl::Status SetThreadTimerSlack(absl::Duration slack) {
  const int64_t ns = std::max<int64_t>(1, absl::ToInt64Nanoseconds(slack));
  if (::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(ns), 0, 0, 0) != 0) {
    return absl::InternalError(
        absl::StrCat("prctl(PR_SET_TIMERSLACK, ", ns, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace kvrail
