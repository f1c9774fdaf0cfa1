// SpinBudget over an injected clock: a thread that spins whenever allowed spends at most its
// share of the time (plus the banked window and one round); an idle thread banks no more than
// the window; no cap and no spin at the two ends; spins held until they end are free when they
// find work (back-to-back traffic is never cut) and capped as before when they do not.
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

// As SpinGreedily, holding each round until the spin ends: never finding work, a refused spin
// ends (Settle) and the thread sleeps `nap`.
absl::Duration SpinHeldGreedily(SpinBudget& budget, absl::Time& now, absl::Duration total,
                                absl::Duration round, absl::Duration nap) {
  const absl::Time end = now + total;
  absl::Duration spun = absl::ZeroDuration();
  while (now < end) {
    if (budget.Allows(now)) {
      budget.Held(now, now + round);
      now += round;
      spun += round;
    } else {
      budget.Settle();
      now += nap;
    }
  }
  budget.Settle();
  return spun;
}

TEST_CASE("held spins that never find work get the share of the time, no more") {
  SpinBudget budget(0.05, absl::Milliseconds(100), kStart);
  absl::Time now = kStart;
  const absl::Duration spun = SpinHeldGreedily(budget, now, absl::Seconds(10),
                                               absl::Microseconds(10), absl::Microseconds(50));
  INFO("spun " << absl::FormatDuration(spun));
  // 5% of 10 s, plus the 5 ms bank and one round.
  CHECK(spun <= absl::Milliseconds(500) + absl::Milliseconds(5) + absl::Microseconds(10));
  CHECK(spun >= absl::Milliseconds(490));
  CHECK(budget.spent() == spun);
  CHECK(budget.released() == absl::ZeroDuration());
  CHECK(budget.refusals() > 0);
}

TEST_CASE("spins that find work are free: back-to-back traffic is never cut") {
  // 5%: 5 ms banked. Back-to-back transfers for about 1 s, the next one found after 30 us of
  // spinning each time (97% of the time spinning): nothing drawn, nothing refused.
  SpinBudget budget(0.05, absl::Milliseconds(100), kStart);
  absl::Time now = kStart;
  absl::Duration spun = absl::ZeroDuration();
  for (int transfer = 0; transfer < 32000; ++transfer) {
    for (int r = 0; r < 30; ++r) {
      REQUIRE(budget.Allows(now));
      budget.Held(now, now + absl::Microseconds(1));
      now += absl::Microseconds(1);
      spun += absl::Microseconds(1);
    }
    budget.Found(absl::InfiniteDuration());
    now += absl::Microseconds(1);  // the transfer's own work
  }
  CHECK(budget.refusals() == 0);
  CHECK(budget.spent() == absl::ZeroDuration());
  CHECK(budget.released() == spun);
  // Then the traffic stops: the spins that find nothing are capped as before (5% of 10 s plus
  // the 5 ms bank and one round).
  const absl::Duration idle = SpinHeldGreedily(budget, now, absl::Seconds(10),
                                               absl::Microseconds(10), absl::Microseconds(50));
  CHECK(idle <= absl::Milliseconds(505) + absl::Microseconds(10));
  CHECK(budget.spent() == idle);
  // Spent (immediate draws) would have cut the same traffic within the first 6 ms.
  SpinBudget drawn(0.05, absl::Milliseconds(100), kStart);
  now = kStart;
  int cut_at = -1;
  for (int transfer = 0; transfer < 32000 && cut_at < 0; ++transfer) {
    for (int r = 0; r < 30; ++r) {
      if (!drawn.Allows(now)) {
        cut_at = transfer;
        break;
      }
      drawn.Spent(now, now + absl::Microseconds(1));
      now += absl::Microseconds(1);
    }
    now += absl::Microseconds(1);
  }
  CHECK(cut_at > 0);
  CHECK(cut_at < 250);
}

TEST_CASE("a found spin is free up to `free`; the rest of it is drawn") {
  SpinBudget budget(0.10, absl::Milliseconds(100), kStart);  // 10 ms banked
  const absl::Time now = kStart;
  budget.Held(now, now + absl::Microseconds(80));
  budget.Found(absl::Microseconds(100));
  CHECK(budget.released() == absl::Microseconds(80));
  CHECK(budget.spent() == absl::ZeroDuration());
  // A 2 ms spin that found the next transfer (a cadence's gap): 100 us free, 1.9 ms drawn.
  budget.Held(now, now + absl::Milliseconds(2));
  budget.Found(absl::Microseconds(100));
  CHECK(budget.released() == absl::Microseconds(180));
  CHECK(budget.spent() == absl::Microseconds(1900));
  // Five more of them spend the 10 ms bank: the next spin is refused.
  for (int i = 0; i < 5; ++i) {
    REQUIRE(budget.Allows(now));
    budget.Held(now, now + absl::Milliseconds(2));
    budget.Found(absl::Microseconds(100));
  }
  CHECK_FALSE(budget.Allows(now));
  // Nothing free: every found spin is drawn whole, as a fruitless one.
  SpinBudget none_free(0.10, absl::Milliseconds(100), kStart);
  none_free.Held(now, now + absl::Microseconds(80));
  none_free.Found(absl::ZeroDuration());
  CHECK(none_free.spent() == absl::Microseconds(80));
  CHECK(none_free.released() == absl::ZeroDuration());
}

TEST_CASE("a held spin ends once it would overdraw the bucket, before it is drawn") {
  SpinBudget budget(0.05, absl::Milliseconds(100), kStart);  // 5 ms banked
  const absl::Time now = kStart;
  budget.Held(now, now + absl::Microseconds(4999));
  CHECK(budget.Allows(now));
  CHECK(budget.Allowance(now) > absl::ZeroDuration());
  budget.Held(now, now + absl::Microseconds(1));
  CHECK_FALSE(budget.Allows(now));  // 5 ms held: the spin ends, found or not
  CHECK(budget.Allowance(now) == absl::ZeroDuration());
  // It found work after all: released, and the bucket is whole again.
  budget.Found(absl::InfiniteDuration());
  CHECK(budget.Allows(now));
  CHECK(budget.spent() == absl::ZeroDuration());
  CHECK(budget.released() == absl::Milliseconds(5));
  // The same held, then settled: drawn, once.
  budget.Held(now, now + absl::Milliseconds(5));
  CHECK(budget.Settle() == absl::Milliseconds(5));
  CHECK(budget.Settle() == absl::ZeroDuration());
  CHECK_FALSE(budget.Allows(now));
  CHECK(budget.spent() == absl::Milliseconds(5));
  // Refilled 50 us: a spin may start and hold those 50 us, no more.
  const absl::Time later = now + absl::Milliseconds(1);
  CHECK(budget.Allows(later));
  budget.Held(later, later + absl::Microseconds(50));
  CHECK_FALSE(budget.Allows(later));
  // Held backwards holds nothing; no cap: held spins never refused.
  budget.Held(later + absl::Milliseconds(1), later);
  CHECK(budget.Settle() == absl::Microseconds(50));
  SpinBudget free(1.0, absl::Milliseconds(100), kStart);
  free.Held(kStart, kStart + absl::Hours(1));
  CHECK(free.Allows(kStart));
  CHECK(free.Settle() == absl::Hours(1));
}

TEST_CASE("the next spin: full when the answer came within the longest spin, else halved") {
  const absl::Duration max = absl::Microseconds(50);
  // Caught by the spin, or missed by a spin shortened earlier but within 50 us: full again.
  CHECK(NextSpin(max, max, absl::Microseconds(12)) == max);
  CHECK(NextSpin(max, max / 8, absl::Microseconds(30)) == max);
  CHECK(NextSpin(max, max / 8, max) == max);
  // Longer than any spin would wait: halved, down to an eighth.
  CHECK(NextSpin(max, max, absl::Microseconds(51)) == absl::Microseconds(25));
  CHECK(NextSpin(max, absl::Microseconds(25), absl::Milliseconds(2)) == absl::Microseconds(12.5));
  CHECK(NextSpin(max, max / 8, absl::Seconds(1)) == max / 8);
  // No spin configured: none.
  CHECK(NextSpin(absl::ZeroDuration(), absl::ZeroDuration(), absl::ZeroDuration()) ==
        absl::ZeroDuration());
  // A spin that stays at an eighth while every answer takes 30 us is what the old rule (halve
  // whenever the spin missed) did: here the first such wait restores it.
  absl::Duration spin = max / 8;
  for (int i = 0; i < 3; ++i) spin = NextSpin(max, spin, absl::Microseconds(30));
  CHECK(spin == max);
}

}  // namespace
}  // namespace kvrail
