// Waiting in tests for something another thread or process does: by the clock, up to a limit
// that is a liveness bound, never an iteration count of short sleeps (those a thread kept off a
// loaded 2-core CI machine can miss; docs/architecture.md, "Tests on a loaded 2-core CI machine").
#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvrail {

// Polls `pred` every `every` until it holds or `limit` has passed; then whether it holds.
template <typename Pred>
bool Eventually(Pred pred, absl::Duration limit, absl::Duration every = absl::Milliseconds(10)) {
  const absl::Time until = absl::Now() + limit;
  while (absl::Now() < until) {
    if (pred()) return true;
    absl::SleepFor(every);
  }
  return pred();
}

}  // namespace kvrail
