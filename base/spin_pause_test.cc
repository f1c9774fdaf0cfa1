#include "base/spin_pause.h"

#include <catch2/catch.hpp>

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

TEST_CASE("a pause returns, before and after the spin starts yielding") {
  const absl::Time start = absl::Now();
  for (int i = 0; i < 1000; ++i) SpinPause(absl::ZeroDuration());
  for (int i = 0; i < 1000; ++i) SpinPause(kSpinKeepsCpu);
  // 2,000 pauses: well under a second even where each yield hands a slice to another thread.
  CHECK(absl::Now() - start < absl::Seconds(30));
}

}  // namespace
}  // namespace kvrail
