#include "base/spin_pause.h"

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <limits>

#include "absl/time/clock.h"

namespace kvrail {
namespace {

// Unix nanoseconds of the last lost yield; the lowest int64 when none.
std::atomic<int64_t> last_lost_ns{std::numeric_limits<int64_t>::min()};

}  // namespace

SpinStep NextSpinStep(absl::Duration spun, absl::Time now, absl::Time lost_at) {
  if (!SpinYields(spun)) return SpinStep::kRelax;
  return now - lost_at < kContendedFor ? SpinStep::kStop : SpinStep::kYield;
}

void YieldCpu() { ::sched_yield(); }

absl::Time LastLostYield() {
  const int64_t ns = last_lost_ns.load(std::memory_order_relaxed);
  return ns == std::numeric_limits<int64_t>::min() ? absl::InfinitePast() : absl::FromUnixNanos(ns);
}

bool SpinPause(absl::Duration spun) {
  const absl::Time before = absl::Now();
  switch (NextSpinStep(spun, before, LastLostYield())) {
    case SpinStep::kRelax:
      for (int i = 0; i < 32; ++i) CpuRelax();
      return true;
    case SpinStep::kStop:
      return false;
    case SpinStep::kYield:
      break;
  }
  YieldCpu();
  const absl::Time after = absl::Now();
  if (after - before < kYieldLost) return true;
  last_lost_ns.store(absl::ToUnixNanos(after), std::memory_order_relaxed);
  return false;
}

}  // namespace kvrail
