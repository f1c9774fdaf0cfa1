// PredictiveWake over recorded gap sequences: a regular cadence is predicted (sleep until the
// arrival less margin and overshoot, spin past it by the tolerance); a burst counts once; jittery
// or too few gaps, a miss and a pause plan as before; the measured overshoot of timed sleeps
// moves the wake-up earlier.
#include "base/predictive_wake.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "absl/time/time.h"

namespace kvrail {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);
constexpr absl::Duration kUs = absl::Microseconds(1);

// Arrivals at kStart + the running sum of `gaps`; returns the last arrival.
absl::Time Replay(PredictiveWake& wake, const std::vector<absl::Duration>& gaps) {
  absl::Time at = kStart;
  wake.Arrived(at);
  for (const absl::Duration gap : gaps) {
    at += gap;
    wake.Arrived(at);
  }
  return at;
}

std::vector<absl::Duration> Regular(int n, absl::Duration gap) {
  return std::vector<absl::Duration>(n, gap);
}

TEST_CASE("a regular cadence: sleep until the arrival less margin and overshoot, then spin") {
  PredictiveWake wake(PredictiveWakeOptions{});
  const absl::Time last = Replay(wake, Regular(8, absl::Milliseconds(2)));
  CHECK(wake.gap() == absl::Milliseconds(2));
  CHECK(wake.jitter() == absl::ZeroDuration());
  // The thread starts its wait 30 us after the arrival (it served it).
  const PredictiveWake::Plan plan = wake.Next(last + 30 * kUs);
  REQUIRE(plan.predicted);
  const absl::Time arrival = last + absl::Milliseconds(2);
  // margin 50 us + the initial overshoot (100 us) before, tolerance 100 us after.
  CHECK(plan.wake_at == arrival - 150 * kUs);
  CHECK(plan.spin_until == arrival + 100 * kUs);
}

TEST_CASE("the measured overshoot of timed sleeps sets how early the thread wakes") {
  PredictiveWake wake(PredictiveWakeOptions{});
  const absl::Time last = Replay(wake, Regular(6, absl::Milliseconds(2)));
  // Sixteen sleeps with a 1 us timer slack: 55-70 us late, one 400 us outlier.
  for (int i = 0; i < 15; ++i) wake.Woke(kStart, kStart + (55 + i) * kUs);
  wake.Woke(kStart, kStart + 400 * kUs);
  CHECK(wake.overshoot() == 69 * kUs);  // the second largest: the outlier does not count
  const PredictiveWake::Plan plan = wake.Next(last);
  REQUIRE(plan.predicted);
  CHECK(plan.wake_at == last + absl::Milliseconds(2) - (50 + 69) * kUs);
}

TEST_CASE("a small jitter widens the spin; a large one plans as before") {
  std::mt19937 rng(7);
  SECTION("within 10 us of 2 ms") {
    std::uniform_int_distribution<int> us(1990, 2010);
    std::vector<absl::Duration> gaps;
    for (int i = 0; i < 12; ++i) gaps.push_back(us(rng) * kUs);
    PredictiveWake wake(PredictiveWakeOptions{});
    const absl::Time last = Replay(wake, gaps);
    const PredictiveWake::Plan plan = wake.Next(last);
    REQUIRE(plan.predicted);
    CHECK(wake.jitter() > absl::ZeroDuration());
    CHECK(wake.jitter() <= 10 * kUs);
    CHECK(plan.spin_until == last + wake.gap() + 100 * kUs + 3 * wake.jitter());
  }
  SECTION("1-3 ms (a client whose steps vary)") {
    std::uniform_int_distribution<int> us(1000, 3000);
    std::vector<absl::Duration> gaps;
    for (int i = 0; i < 12; ++i) gaps.push_back(us(rng) * kUs);
    PredictiveWake wake(PredictiveWakeOptions{});
    CHECK_FALSE(wake.Next(Replay(wake, gaps)).predicted);
  }
  SECTION("Poisson arrivals, 2 ms mean") {
    std::exponential_distribution<double> ms(0.5);
    std::vector<absl::Duration> gaps;
    for (int i = 0; i < 12; ++i) gaps.push_back(absl::Milliseconds(ms(rng)) + 300 * kUs);
    PredictiveWake wake(PredictiveWakeOptions{});
    CHECK_FALSE(wake.Next(Replay(wake, gaps)).predicted);
  }
}

TEST_CASE(
    "gaps drawn from 0.5-3.5 ms (completion_bench's irregular traffic) are rarely predicted") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> us(500, 3500);
  PredictiveWake wake(PredictiveWakeOptions{});
  absl::Time at = kStart;
  int predicted = 0;
  for (int i = 0; i < 5000; ++i) {
    at += us(rng) * kUs;
    wake.Arrived(at);
    predicted += wake.Next(at + 20 * kUs).predicted;
  }
  // Eight random gaps now and then fall within a tenth of their median (29 of 5,000 with this
  // seed): each costs one spin (~250 us, from the budget, mostly a miss), 0.07% of a core here.
  INFO(predicted << " of 5000 waits predicted");
  CHECK(predicted <= 50);
}

TEST_CASE("one late step among regular ones does not move the median") {
  std::vector<absl::Duration> gaps = Regular(8, absl::Milliseconds(2));
  gaps[5] = absl::Milliseconds(9);
  PredictiveWake wake(PredictiveWakeOptions{});
  const absl::Time last = Replay(wake, gaps);
  CHECK(wake.gap() == absl::Milliseconds(2));
  CHECK(wake.Next(last).predicted);
}

TEST_CASE("a burst (K, V, aux 10 us apart) counts once; the cadence is burst to burst") {
  PredictiveWake wake(PredictiveWakeOptions{});
  absl::Time step = kStart;
  for (int i = 0; i < 6; ++i) {
    for (int k = 0; k < 3; ++k) wake.Arrived(step + k * 10 * kUs);
    step += absl::Milliseconds(3);
  }
  CHECK(wake.gap() == absl::Milliseconds(3));
  const PredictiveWake::Plan plan = wake.Next(step - absl::Milliseconds(3) + 40 * kUs);
  REQUIRE(plan.predicted);
  CHECK(plan.spin_until == step + 100 * kUs);
}

TEST_CASE("back-to-back traffic is one long burst: nothing to predict") {
  PredictiveWake wake(PredictiveWakeOptions{});
  absl::Time at = kStart;
  for (int i = 0; i < 1000; ++i) {
    wake.Arrived(at);
    at += 60 * kUs;
  }
  CHECK(wake.gap() == absl::ZeroDuration());
  CHECK_FALSE(wake.Next(at).predicted);
}

TEST_CASE("too few gaps, or a cadence too fast for the window, plan as before") {
  PredictiveWake few(PredictiveWakeOptions{});
  CHECK_FALSE(few.Next(Replay(few, Regular(3, absl::Milliseconds(2)))).predicted);
  // 500 us: a 150 us spin (margin + tolerance) is more than a quarter of the gap.
  PredictiveWake fast(PredictiveWakeOptions{});
  CHECK_FALSE(fast.Next(Replay(fast, Regular(8, 500 * kUs))).predicted);
}

TEST_CASE("a stop: the spin misses, the thread blocks; a pause drops the history") {
  PredictiveWake wake(PredictiveWakeOptions{});
  const absl::Time last = Replay(wake, Regular(8, absl::Milliseconds(2)));
  REQUIRE(wake.Next(last).predicted);
  wake.Missed();  // nothing came by spin_until
  CHECK(wake.misses() == 1);
  CHECK_FALSE(wake.Next(last + absl::Milliseconds(2) + 100 * kUs).predicted);
  // Traffic resumes a second later at the same cadence: learned again from scratch.
  absl::Time at = last + absl::Seconds(1);
  wake.Arrived(at);
  for (size_t i = 0; i < PredictiveWake::kMinGaps - 1; ++i) {
    at += absl::Milliseconds(2);
    wake.Arrived(at);
    CHECK_FALSE(wake.Next(at).predicted);
  }
  at += absl::Milliseconds(2);
  wake.Arrived(at);
  CHECK(wake.Next(at).predicted);
}

TEST_CASE("a wait that begins past the window plans as before; inside it, spins at once") {
  PredictiveWake wake(PredictiveWakeOptions{});
  const absl::Time last = Replay(wake, Regular(8, absl::Milliseconds(2)));
  const absl::Time arrival = last + absl::Milliseconds(2);
  CHECK_FALSE(wake.Next(arrival + 100 * kUs).predicted);
  const PredictiveWake::Plan plan = wake.Next(arrival - 20 * kUs);
  REQUIRE(plan.predicted);
  CHECK(plan.wake_at < arrival - 20 * kUs);  // already due: the caller spins without a sleep
}

TEST_CASE("a long overshoot (a host in deep idle states) moves the wake-up, not the verdict") {
  PredictiveWake wake(PredictiveWakeOptions{});
  const absl::Time last = Replay(wake, Regular(8, absl::Milliseconds(2)));
  // 400 us to wake from a timed sleep: from the sleep's deadline to the spin's end 550 us, more
  // than a quarter of the gap, but the spin itself (from the wake-up) 150 us.
  for (int i = 0; i < 16; ++i) wake.Woke(kStart, kStart + 400 * kUs);
  const PredictiveWake::Plan plan = wake.Next(last);
  REQUIRE(plan.predicted);
  CHECK(plan.wake_at == last + absl::Milliseconds(2) - 450 * kUs);
}

TEST_CASE("margin and tolerance are the options'") {
  PredictiveWakeOptions options;
  options.margin = 10 * kUs;
  options.tolerance = 300 * kUs;
  PredictiveWake wake(options);
  const absl::Time last = Replay(wake, Regular(8, absl::Milliseconds(4)));
  wake.Woke(kStart, kStart + 5 * kUs);
  const PredictiveWake::Plan plan = wake.Next(last);
  REQUIRE(plan.predicted);
  CHECK(plan.wake_at == last + absl::Milliseconds(4) - 15 * kUs);
  CHECK(plan.spin_until == last + absl::Milliseconds(4) + 300 * kUs);
}

TEST_CASE("arrivals reported out of order count as the latest") {
  PredictiveWake wake(PredictiveWakeOptions{});
  const absl::Time last = Replay(wake, Regular(8, absl::Milliseconds(2)));
  wake.Arrived(last - absl::Milliseconds(1));  // e.g. a batch's enqueue time, read late
  CHECK(wake.gap() == absl::Milliseconds(2));
}

TEST_CASE("the thread's timer slack can be set") {
  CHECK(SetThreadTimerSlack(absl::Microseconds(1)).ok());
  CHECK(SetThreadTimerSlack(absl::ZeroDuration()).ok());  // 1 ns, not the reset to default
}

}  // namespace
}  // namespace kvrail
