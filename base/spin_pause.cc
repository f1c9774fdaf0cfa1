#include "base/spin_pause.h"

#include <sched.h>

namespace kvrail {

void YieldCpu() { ::sched_yield(); }

void SpinPause(absl::Duration spun) {
  if (SpinYields(spun)) {
    YieldCpu();
    return;
  }
  for (int i = 0; i < 32; ++i) CpuRelax();
}

}  // namespace kvrail
