// Capped exponential backoff for reconnecting to etcd: initial, doubled on each failure up to
// max, with jitter so a cluster of daemons that lost etcd together does not reconnect in step.
#pragma once

#include <functional>

#include "absl/time/time.h"

namespace kvrail::directory {

// Not thread-safe: one owner (the etcd directory's session thread).
class Backoff {
 public:
  // `uniform01` returns values in [0, 1); each delay is drawn from [d * (1 - jitter), d] where d
  // is the current (doubling, capped) step. Default: a random source; tests pass a fixed one.
  Backoff(absl::Duration initial, absl::Duration max, double jitter = 0.2,
          std::function<double()> uniform01 = nullptr);
  // The delay before the next attempt; advances the step.
  absl::Duration Next();
  // After a success: the next failure waits `initial` again.
  void Reset();
  // Failures since the last Reset.
  int failures() const { return failures_; }

 private:
  const absl::Duration initial_;
  const absl::Duration max_;
  const double jitter_;
  std::function<double()> uniform01_;
  absl::Duration step_;
  int failures_ = 0;
};

}  // namespace kvrail::directory
