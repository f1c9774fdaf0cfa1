// A Clock that moves only when told to, for tests of deadlines, waits and timestamps.
#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace kvrail {

// Thread-safe: Now() may be read on any thread while a test thread advances it.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::FromUnixSeconds(1700000000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration by) {
    absl::MutexLock lock(&mu_);
    now_ += by;
  }
  void Set(absl::Time to) {
    absl::MutexLock lock(&mu_);
    now_ = to;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail
