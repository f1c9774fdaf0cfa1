// How a spinning thread waits between two looks at what it waits for. For the first
// kSpinKeepsCpu of a spin it keeps its CPU (a look every ~0.1 us: an answer that comes quickly is
// seen at once); after that each pause gives the CPU to any other runnable thread on it
// (sched_yield returns at once when there is none). On a machine with fewer CPUs than runnable
// threads a spinner that kept its CPU to the end of its slice delays the very thread whose work
// it waits for, by up to the rest of the spin: on 2 vCPUs a client's 200 us answer spin held back
// kvraild's answer in ~1% of round trips (p99 ~415 us where the median was ~27).
//
// A yield is only cheap while nobody else wants the CPU. When another thread does (a busy tenant
// of the same machine), sched_yield hands it the CPU for the rest of its slice, and the yielding
// thread, still runnable, is not woken when what it waits for arrives: the scheduler gets no
// wake-up to preempt on. On 2 vCPUs beside a busy tenant such yields cost 0.3-2.5 ms (measured:
// the waiting thread's run delay, involuntary switches, no sleep). So a yield that comes back late
// (kYieldLost) ends the spin: the caller blocks on its wake-up (an eventfd or futex the other
// side writes), which the scheduler can act on, and for kContendedFor after it every spin of the
// process ends at kSpinKeepsCpu instead of yielding. On a machine with idle CPUs yields come back
// at once and spins run their whole length, as before.
//
// Thread contract: thread-safe; the process-wide record of the last lost yield is one atomic.
#pragma once

#include "absl/time/time.h"

namespace kvrail {

inline constexpr absl::Duration kSpinKeepsCpu = absl::Microseconds(20);
// A yield that took this long gave the CPU to another thread for a while (an uncontended
// sched_yield returns in about a microsecond).
inline constexpr absl::Duration kYieldLost = absl::Microseconds(50);
// How long after a lost yield the process's spins stop at kSpinKeepsCpu.
inline constexpr absl::Duration kContendedFor = absl::Seconds(1);

// Whether a spin that has gone on for `spun` gives its CPU away at its next pause.
inline bool SpinYields(absl::Duration spun) { return spun >= kSpinKeepsCpu; }

// What a spin does at its next pause.
enum class SpinStep {
  kRelax,  // keep the CPU: a few CpuRelax
  kYield,  // give the CPU to any other runnable thread (YieldCpu)
  kStop,   // stop spinning: the caller blocks on its wake-up
};

// Pure: the next step of a spin that has gone on for `spun`, at `now`, when a yield of this
// process last lost its CPU at `lost_at` (absl::InfinitePast() if never).
SpinStep NextSpinStep(absl::Duration spun, absl::Time now, absl::Time lost_at);

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

// One pause of a spin that has gone on for `spun` (NextSpinStep): a few CpuRelax, a YieldCpu, or
// nothing. False when the spin should stop now and its thread block instead: the process's CPUs
// are contended (this pause's yield came back late, or one did within kContendedFor).
bool SpinPause(absl::Duration spun);

// When a yield of this process last lost its CPU (absl::InfinitePast() if never).
absl::Time LastLostYield();

}  // namespace kvrail
