#include "base/spin_pause.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "absl/time/clock.h"

namespace kvrail {
namespace {

TEST_CASE("a spin keeps its CPU for its first microseconds, then yields it at each pause") {
  CHECK_FALSE(SpinYields(absl::ZeroDuration()));
  CHECK_FALSE(SpinYields(kSpinKeepsCpu - absl::Nanoseconds(1)));
  CHECK(SpinYields(kSpinKeepsCpu));
  CHECK(SpinYields(absl::Milliseconds(5)));
  // Short enough for a client's answer spin (200 us by default) to give its CPU away for most of
  // its length, long enough that an answer coming within a few microseconds is seen at once.
  CHECK(kSpinKeepsCpu >= absl::Microseconds(5));
  CHECK(kSpinKeepsCpu <= absl::Microseconds(50));
}

TEST_CASE("a lost yield stops the spins that follow it for kContendedFor, then they yield again") {
  const absl::Time now = absl::FromUnixSeconds(1000);
  const absl::Time never = absl::InfinitePast();
  // Before kSpinKeepsCpu a spin keeps its CPU, contended or not.
  CHECK(NextSpinStep(absl::ZeroDuration(), now, never) == SpinStep::kRelax);
  CHECK(NextSpinStep(kSpinKeepsCpu - absl::Nanoseconds(1), now, now) == SpinStep::kRelax);
  // After it: a yield, unless a yield lost its CPU within kContendedFor.
  CHECK(NextSpinStep(kSpinKeepsCpu, now, never) == SpinStep::kYield);
  CHECK(NextSpinStep(kSpinKeepsCpu, now, now) == SpinStep::kStop);
  CHECK(NextSpinStep(absl::Milliseconds(1), now, now - kContendedFor + absl::Nanoseconds(1)) ==
        SpinStep::kStop);
  CHECK(NextSpinStep(absl::Milliseconds(1), now, now - kContendedFor) == SpinStep::kYield);
  // An uncontended sched_yield takes about a microsecond; a lost one a slice (0.3-4 ms).
  CHECK(kYieldLost >= absl::Microseconds(20));
  CHECK(kYieldLost <= absl::Microseconds(200));
}

// Pins the calling thread to `cpu`; false where the machine does not let it.
bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

TEST_CASE("a spin on a CPU another thread keeps busy stops instead of yielding it away") {
  const int cpu = sched_getcpu();
  REQUIRE(cpu >= 0);
  REQUIRE(PinTo(cpu));
  std::atomic<bool> stop{false};
  std::atomic<bool> hog_started{false};
  // The hog: runnable all the time on the spinner's CPU, as a busy tenant's thread is.
  std::thread hog([&] {
    if (!PinTo(cpu)) return;
    hog_started = true;
    while (!stop.load(std::memory_order_relaxed)) CpuRelax();
  });
  while (!hog_started.load()) std::this_thread::yield();
  // Each yield hands the CPU to the hog; the first that comes back late stops the spin.
  const absl::Time start = absl::Now();
  int pauses = 0;
  bool stopped = false;
  while (absl::Now() - start < absl::Seconds(20)) {
    ++pauses;
    if (!SpinPause(kSpinKeepsCpu)) {
      stopped = true;
      break;
    }
  }
  const absl::Time stopped_at = absl::Now();
  // Remembered: the process's next spins stop at kSpinKeepsCpu without a yield of their own.
  const bool next_stops = !SpinPause(kSpinKeepsCpu);
  // Before kSpinKeepsCpu a pause keeps the CPU, contended or not.
  const bool early_keeps = SpinPause(absl::ZeroDuration());
  stop = true;
  hog.join();
  INFO("pauses " << pauses);
  CHECK(stopped);
  CHECK(LastLostYield() >= start);
  CHECK(LastLostYield() <= stopped_at);
  CHECK(next_stops);
  CHECK(early_keeps);
}

TEST_CASE("a pause returns, before and after the spin starts yielding") {
  const absl::Time start = absl::Now();
  for (int i = 0; i < 1000; ++i) SpinPause(absl::ZeroDuration());
  for (int i = 0; i < 1000; ++i) SpinPause(kSpinKeepsCpu);
  // 2,000 pauses: well under a second even where each yield hands a slice to another thread.
  CHECK(absl::Now() - start < absl::Seconds(30));
}

}  // namespace
}  // namespace kvrail
