// Time source, injectable so tests control deadlines and timestamps.
#pragma once

#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvrail {

// Thread-safe: implementations must allow concurrent calls.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  int64_t NowUnixMicros() const { return absl::ToUnixMicros(Now()); }

  // The process-wide wall clock.
  static Clock* Real();
};

}  // namespace kvrail
