#include "daemon/directory/backoff.h"

#include <algorithm>
#include <memory>
#include <random>

namespace kvrail::directory {

Backoff::Backoff(absl::Duration initial, absl::Duration max, double jitter,
                 std::function<double()> uniform01)
    : initial_(initial),
      max_(std::max(initial, max)),
      jitter_(std::clamp(jitter, 0.0, 1.0)),
      uniform01_(std::move(uniform01)),
      step_(initial) {
  if (!uniform01_) {
    uniform01_ = [rng = std::make_shared<std::mt19937_64>(std::random_device{}())] {
      return std::uniform_real_distribution<double>(0.0, 1.0)(*rng);
    };
  }
}

absl::Duration Backoff::Next() {
  const absl::Duration step = step_;
  step_ = std::min(step_ * 2, max_);
  ++failures_;
  const double u = std::clamp(uniform01_(), 0.0, 1.0);
  return step * (1.0 - jitter_ * u);
}

void Backoff::Reset() {
  step_ = initial_;
  failures_ = 0;
}

}  // namespace kvrail::directory
