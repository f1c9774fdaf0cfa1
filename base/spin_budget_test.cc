// SpinBudget over an injected clock: a thread that spins whenever allowed spends at most its
// share of the time (plus the banked window and one round); an idle thread banks no more than
// the window; no cap and no spin at the two ends.
#include "base/spin_budget.h"

#include <catch2/catch.hpp>

#include "absl/time/time.h"

namespace kvrail {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

// Simulates `total` of a poll thread that spins in rounds of `round` while the budget allows
// and otherwise sleeps `nap`; returns the time it spun.
absl::Duration SpinGreedily(SpinBudget& budget, absl::Time& now, absl::Duration total,
                            absl::Duration round, absl::Duration nap) {
  const absl::Time end = now + total;
  absl::Duration spun = absl::ZeroDuration();
  while (now < end) {
    if (budget.Allows(now)) {
      budget.Spent(now, now + round);
      now += round;
      spun += round;
    } else {
      now += nap;
    }
  }
  return spun;
}

TEST_CASE("a greedy spinner gets its share of the time, no more") {
  SpinBudget budget(0.05, absl::Milliseconds(100), kStart);
  absl::Time now = kStart;
  const absl::Duration spun =
      SpinGreedily(budget, now, absl::Seconds(10), absl::Microseconds(10), absl::Microseconds(50));
  INFO("spun " << absl::FormatDuration(spun));
  // 5% of 10 s, plus the 5 ms banked at the start and one round over.
  CHECK(spun <= absl::Milliseconds(500) + absl::Milliseconds(5) + absl::Microseconds(10));
  CHECK(spun >= absl::Milliseconds(490));  // the budget is used, not wasted
  CHECK(budget.spent() == spun);
  CHECK(budget.refusals() > 0);
}

TEST_CASE("an idle thread banks at most share x window") {
  SpinBudget budget(0.10, absl::Milliseconds(100), kStart);
  absl::Time now = kStart + absl::Seconds(60);  // a minute with no spin at all
  absl::Duration burst = absl::ZeroDuration();
  while (budget.Allows(now)) {
    budget.Spent(now, now + absl::Microseconds(1));
    now += absl::Microseconds(1);
    burst += absl::Microseconds(1);
  }
  INFO("burst " << absl::FormatDuration(burst));
  // 10 ms banked; the bucket refills at 10% while the burst runs: 10 ms / (1 - 0.1).
  CHECK(burst >= absl::Milliseconds(10));
  CHECK(burst <= absl::Microseconds(11112));
}

TEST_CASE("a decode cadence under the share is never cut") {
  // 150 us of spin every 2 ms is 7.5%: a 10% budget allows every one of them.
  SpinBudget budget(0.10, absl::Milliseconds(100), kStart);
  absl::Time now = kStart;
  for (int step = 0; step < 5000; ++step) {
    for (int r = 0; r < 15; ++r) {
      REQUIRE(budget.Allows(now));
      budget.Spent(now, now + absl::Microseconds(10));
      now += absl::Microseconds(10);
    }
    now += absl::Microseconds(1850);
  }
  CHECK(budget.refusals() == 0);
  // The same cadence with a 5% budget is cut to about 5% of the time.
  SpinBudget tight(0.05, absl::Milliseconds(100), kStart);
  now = kStart;
  absl::Duration spun = absl::ZeroDuration();
  for (int step = 0; step < 5000; ++step) {
    for (int r = 0; r < 15 && tight.Allows(now); ++r) {
      tight.Spent(now, now + absl::Microseconds(10));
      now += absl::Microseconds(10);
      spun += absl::Microseconds(10);
    }
    now += absl::Microseconds(1850);
  }
  const double share = absl::FDivDuration(spun, now - kStart);
  INFO("share " << share);
  CHECK(share <= 0.05 + 0.001 + 0.0005);  // + the banked 5 ms over 10 s + one round per step
  CHECK(share >= 0.045);
  CHECK(tight.refusals() > 0);
}

TEST_CASE("share 1 never refuses, share 0 never allows, time going back is ignored") {
  SpinBudget free(1.0, absl::Milliseconds(100), kStart);
  absl::Time now = kStart;
  CHECK(absl::ToDoubleSeconds(SpinGreedily(free, now, absl::Seconds(1), absl::Microseconds(10),
                                           absl::Microseconds(50))) == Approx(1.0));
  CHECK_FALSE(free.capped());
  SpinBudget none(0.0, absl::Milliseconds(100), kStart);
  CHECK_FALSE(none.Allows(kStart));
  CHECK_FALSE(none.Allows(kStart + absl::Hours(1)));
  SpinBudget budget(0.5, absl::Milliseconds(10), kStart);
  budget.Spent(kStart + absl::Milliseconds(5), kStart);  // to before from: nothing drawn
  CHECK(budget.spent() == absl::ZeroDuration());
  CHECK(budget.Allows(kStart - absl::Seconds(1)));  // an earlier reading: the bucket as it was
}

TEST_CASE("allowance: a spin of that length empties the bucket, never below zero") {
  // 50%: 50 ms banked; a spin from full lasts 100 ms (it drains at half the rate it runs).
  SpinBudget half(0.5, absl::Milliseconds(100), kStart);
  CHECK(half.Allowance(kStart) == absl::Milliseconds(100));
  half.Spent(kStart, kStart + absl::Milliseconds(30));
  const absl::Time t1 = kStart + absl::Milliseconds(30);
  CHECK(half.Allowance(t1) == absl::Milliseconds(70));  // 35 ms left
  half.Spent(t1, t1 + absl::Milliseconds(70));
  const absl::Time t2 = t1 + absl::Milliseconds(70);
  CHECK(half.Allowance(t2) == absl::ZeroDuration());
  CHECK_FALSE(half.Allows(t2));
  CHECK(half.refusals() == 2);
  // 10 ms asleep bank 5 ms: 10 ms of spin.
  CHECK(half.Allowance(t2 + absl::Milliseconds(10)) == absl::Milliseconds(10));
  // 10%: 10 ms banked; a spin of the allowance (11.1 ms) leaves the bucket empty, not negative.
  SpinBudget tenth(0.1, absl::Milliseconds(100), kStart);
  const absl::Duration a = tenth.Allowance(kStart);
  CHECK(absl::ToDoubleMicroseconds(a) == Approx(10000 / 0.9).margin(0.01));
  tenth.Spent(kStart, kStart + a);
  CHECK(tenth.Allows(kStart + a + absl::Nanoseconds(10)));
  CHECK(tenth.Allowance(kStart + a) <= absl::Nanoseconds(2));
  // No cap, no spin.
  CHECK(SpinBudget(1.0, absl::Milliseconds(100), kStart).Allowance(kStart) ==
        absl::InfiniteDuration());
  CHECK(SpinBudget(0.0, absl::Milliseconds(100), kStart).Allowance(kStart + absl::Hours(1)) ==
        absl::ZeroDuration());
}

}  // namespace
}  // namespace kvrail
