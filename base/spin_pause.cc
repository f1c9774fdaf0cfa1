#include "base/spin_pause.h"

#include <sched.h>

namespace kvrail {

void SpinPause(absl::Duration spun) {
  if (SpinYields(spun)) {
    ::sched_yield();
    return;
  }
  for (int i = 0; i < 32; ++i) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

}  // namespace kvrail
