// Predictive wake ("spin late"): when the work a waiting thread waits for comes at a steady
// cadence (a decode step's transfer every few milliseconds), the thread sleeps most of the gap
// and spins only around the next arrival, instead of sleeping through it (a wake-up on the
// critical path: 50-190 us) or spinning the whole gap (a core per thread).
//
// It learns the gap between bursts of arrivals (arrivals closer than `burst` are one burst: a
// step's K, V and aux, or a SUBMIT and its WAIT) as the median of the latest gaps and their
// jitter as the median absolute deviation, and the overshoot of the thread's timed sleeps (a
// timed wait ends late by the timer slack, 50 us by default, plus the thread's wake-up: 55-70 us
// on a 2-vCPU VM with a 1 us slack, ~100 us with the default). While the gaps are regular it
// plans: sleep until predicted arrival - margin - overshoot, spin until predicted arrival +
// tolerance (+ 3 x jitter), then block as before. Too few gaps, jitter above a tenth of the gap,
// a spin (margin + tolerance + 3 x jitter) longer than a quarter of the gap, a gap past `max_gap`
// (a pause: the history starts again) or a spin that missed (until the next arrival) all plan as
// before: block at once. The caller draws the spin from its SpinBudget; the plan only says when.
//
// Probe, describe, compute: the caller reads its clock and reports arrivals and wake-ups; Next
// is a pure function of what was reported (unit tested over recorded gap sequences).
//
// Thread contract: not thread-safe; the waiting thread owns it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvrail {

struct PredictiveWakeOptions {
  // Wake this long before the predicted arrival, beyond the learned overshoot of a timed sleep.
  absl::Duration margin = absl::Microseconds(50);
  // Spin this long past the predicted arrival (widened by 3 x the learned jitter) before
  // blocking as before.
  absl::Duration tolerance = absl::Microseconds(100);
  // Arrivals closer than this to the previous one are the same burst; a cadence's gap is longer.
  absl::Duration burst = absl::Microseconds(250);
  // A gap longer than this is a pause, not a cadence: the gaps learned so far are dropped.
  absl::Duration max_gap = absl::Milliseconds(50);
};

class PredictiveWake {
 public:
  // Gaps the estimate is taken over, and the fewest that make a cadence.
  static constexpr size_t kGaps = 8;
  static constexpr size_t kMinGaps = 4;
  // The overshoot assumed before a timed sleep was measured (the default timer slack's).
  static constexpr absl::Duration kInitialOvershoot = absl::Microseconds(100);

  explicit PredictiveWake(PredictiveWakeOptions options) : options_(options) {}

  // The work the thread waits for came at `at` (times before the latest arrival count as it).
  void Arrived(absl::Time at);
  // A timed sleep asked to end at `asked` ended at `woke` without work: its overshoot is learned.
  void Woke(absl::Time asked, absl::Time woke);
  // A spin the plan asked for ended without the work: until the next arrival, Next plans as
  // before (block at once).
  void Missed();

  struct Plan {
    bool predicted = false;  // false: block as before (wake_at and spin_until unused)
    absl::Time wake_at;      // sleep until here (<= the wait's start: spin at once)
    absl::Time spin_until;   // spin until here, then block as before
  };
  // What a thread whose wait begins at `now` does.
  Plan Next(absl::Time now) const;

  // The learned cadence (zero before kMinGaps gaps), its jitter and the overshoot assumed.
  absl::Duration gap() const;
  absl::Duration jitter() const;
  absl::Duration overshoot() const;
  uint64_t misses() const { return misses_; }

 private:
  // The median absolute deviation of the gaps from `median` (gap()'s; zero: none learned).
  absl::Duration JitterAround(absl::Duration median) const;

  const PredictiveWakeOptions options_;
  std::array<absl::Duration, kGaps> gaps_{};
  size_t gap_count_ = 0;  // gaps_ holds min(gap_count_, kGaps), the latest at (gap_count_-1)%kGaps
  absl::Time burst_start_ = absl::InfinitePast();
  absl::Time last_arrival_ = absl::InfinitePast();
  bool missed_ = false;
  uint64_t misses_ = 0;
  static constexpr size_t kOvershoots = 16;
  std::array<absl::Duration, kOvershoots> overshoots_{};
  size_t overshoot_count_ = 0;
};

// Sets the calling thread's timer slack (prctl PR_SET_TIMERSLACK; at least 1 ns: 0 would reset
// it to the process default), so its timed sleeps end within `slack` of their deadline, plus the
// wake-up, not 50 us late. A probe, not part of the class above. INTERNAL naming the call on
// failure.
absl::Status SetThreadTimerSlack(absl::Duration slack);

}  // namespace kvrail
