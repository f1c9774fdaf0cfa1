// How a spinning thread waits between two looks at what it waits for. For the first
// kSpinKeepsCpu of a spin it keeps its CPU (a look every ~0.1 us: an answer that comes quickly is
// seen at once); after that each pause gives the CPU to any other runnable thread on it
// (sched_yield returns at once when there is none). On a machine with fewer CPUs than runnable
// threads a spinner that kept its CPU to the end of its slice delays the very thread whose work
// it waits for, by up to the rest of the spin: on 2 vCPUs a client's 200 us answer spin held back
// kvraild's answer in ~1% of round trips (p99 ~415 us where the median was ~27).
//
// Thread contract: stateless; any thread.
#pragma once

#include "absl/time/time.h"

namespace kvrail {

inline constexpr absl::Duration kSpinKeepsCpu = absl::Microseconds(20);

// Whether a spin that has gone on for `spun` gives its CPU away at its next pause.
inline bool SpinYields(absl::Duration spun) { return spun >= kSpinKeepsCpu; }

// One CPU pause instruction (x86 `pause`, Arm `yield`): a spin's look that keeps its CPU.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Gives the CPU to any other runnable thread on it (sched_yield; returns at once when none).
void YieldCpu();

// One pause of a spin that has gone on for `spun`: a few CpuRelax, or past kSpinKeepsCpu a
// YieldCpu.
void SpinPause(absl::Duration spun);

}  // namespace kvrail
