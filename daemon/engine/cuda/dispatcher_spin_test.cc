// The dispatcher's idle spin on the fake GPU (dispatcher_test_rig.h), its thread serving as in
// the daemon and its clock a test clock that moves one step at each reading: with nothing to do
// it spins its configured time and then sleeps; a job that comes ends the spin at once; under a
// budget it spins no more than the budget's share of the time (plus the banked window); zero
// time or a zero budget never spins and the dispatcher still wakes for work; predictive wake
// spins around each job of a steady cadence and sleeps once it stops.
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/predictive_wake.h"
#include "daemon/engine/cuda/dispatcher.h"
#include "daemon/engine/cuda/dispatcher_test_rig.h"

namespace kvrail::engine::cuda_detail {
namespace {

using testing::AllOk;
using testing::Rig;
using testing::TestJob;
using testing::TestOptions;

// A clock that moves `step` at each reading (a spinning thread's time passes as it polls), and
// as much as a test says between. Thread-safe.
class SteppingClock final : public Clock {
 public:
  explicit SteppingClock(absl::Duration step) : step_(step) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    now_ += step_;
    return now_;
  }
  void Advance(absl::Duration by) {
    absl::MutexLock lock(&mu_);
    now_ += by;
  }
  absl::Time Peek() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }

 private:
  const absl::Duration step_;
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1700000000);
};

CudaEngineOptions SpinOptions(int spin_us, double budget) {
  CudaEngineOptions o = TestOptions();
  o.stream_wait = false;  // no gate: nothing but the dispatcher reads the clock
  o.dispatcher_spin_us = spin_us;
  o.dispatcher_spin_budget = budget;
  return o;
}

// One GPU's parts on the stepping clock, the dispatcher serving on a thread of its own.
struct SpinRig {
  SpinRig(CudaEngineOptions o, absl::Duration step)
      : clock(step),
        options(o),
        queues(o.limits, o.batch_bytes, &clock),
        gate(&fake, &clock, Rig::Gate(o)),
        dispatcher(&fake, &clock, o, 0, &queues, &gate, &stats) {
    REQUIRE(gate.Make().ok());
    REQUIRE(dispatcher.stager().Make().ok());
    start = clock.Peek();  // the budget's start (the dispatcher's construction), to a step
    thread = std::thread([this] { dispatcher.Serve(); });
  }
  ~SpinRig() { Stop(); }
  void Stop() {
    queues.Stop();
    if (thread.joinable()) thread.join();
  }
  IdleSpinCounts spins() const { return stats.idle_spins(); }
  // Waits (real time, at most 20 s) until `done` holds.
  static bool WaitFor(const std::function<bool()>& done) {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!done()) {
      if (absl::Now() > give_up) return false;
      absl::SleepFor(absl::Microseconds(200));
    }
    return true;
  }
  // Runs one job through the serving dispatcher.
  bool RunJob(std::mt19937_64& rng) {
    auto job = std::make_shared<TestJob>(planner::testing::RandomPagedCase(rng), rng);
    queues.Enqueue(job, job->AllTiles());
    if (!WaitFor([&] { return job->reported() == job->plan().num_tiles(); })) return false;
    return AllOk(*job) && job->copied();
  }

  SteppingClock clock;
  FakeGpuOps fake;
  const CudaEngineOptions options;
  DispatchQueues queues;
  WorkerStats stats;
  GpuGate gate;
  Dispatcher dispatcher;
  absl::Time start;
  std::thread thread;
};

TEST_CASE("idle spin: with nothing to do it spins its configured time, then sleeps") {
  std::mt19937_64 rng(41);
  SpinRig rig(SpinOptions(1000, 1.0), absl::Microseconds(1));
  REQUIRE(SpinRig::WaitFor([&] { return rig.spins().ended == 1; }));
  IdleSpinCounts s = rig.spins();
  INFO("spun " << absl::FormatDuration(s.last));
  CHECK(s.began == 1);
  CHECK(s.hits == 0);
  CHECK(s.cut == 0);
  CHECK(s.last >= absl::Microseconds(1000));  // not a step less than configured
  CHECK(s.last <= absl::Microseconds(1001));  // and no step more than the one that saw the end
  // Asleep now: no further spin while nothing comes.
  absl::SleepFor(absl::Milliseconds(30));
  CHECK(rig.spins().began == 1);
  // A job wakes it and runs; once idle again it spins once more, the whole time.
  REQUIRE(rig.RunJob(rng));
  REQUIRE(SpinRig::WaitFor([&] { return rig.spins().ended == 2; }));
  s = rig.spins();
  CHECK(s.last >= absl::Microseconds(1000));
  CHECK(s.last <= absl::Microseconds(1001));
  CHECK(s.spun >= absl::Microseconds(2000));
  CHECK(s.spun <= absl::Microseconds(2002));
  CHECK(rig.stats.Gauges().at("dispatcher_spin_seconds_total") ==
        Approx(absl::ToDoubleSeconds(s.spun)));
  CHECK(rig.stats.Describe(0, 8, 0).find("idle spin: 2 spins") != std::string::npos);
}

TEST_CASE("idle spin: a job that comes ends the spin at once and runs") {
  std::mt19937_64 rng(42);
  // 1000 s at a nanosecond per reading: only work (or the stop) ends this spin.
  SpinRig rig(SpinOptions(1000 * 1000 * 1000, 1.0), absl::Nanoseconds(1));
  REQUIRE(SpinRig::WaitFor([&] { return rig.spins().began == 1; }));
  absl::SleepFor(absl::Milliseconds(20));
  CHECK(rig.spins().ended == 0);  // still spinning
  REQUIRE(rig.RunJob(rng));
  IdleSpinCounts s = rig.spins();
  CHECK(s.ended >= 1);
  CHECK(s.hits == s.ended);
  CHECK(s.cut == 0);
  CHECK(s.spun < absl::Minutes(1));
  // The next idle spin is ended by the stop.
  REQUIRE(SpinRig::WaitFor([&] { return rig.spins().began == s.ended + 1; }));
  rig.Stop();
  CHECK(rig.spins().ended == rig.spins().hits);
}

TEST_CASE("idle spin: under a budget it spins no more than the budget's share of the time") {
  // 10% of the time, 10 ms banked; a 5 ms spin wanted after each job; 2 ms asleep between.
  const double share = 0.10;
  const absl::Duration spin = absl::Milliseconds(5), gap = absl::Milliseconds(2),
                       step = absl::Microseconds(1);
  SpinRig rig(SpinOptions(5000, share), step);
  constexpr uint64_t kCycles = 60;
  std::vector<absl::Duration> each;
  for (uint64_t k = 1; k <= kCycles; ++k) {
    REQUIRE(SpinRig::WaitFor([&] { return rig.spins().ended >= k; }));
    each.push_back(rig.spins().last);
    // Asleep: the budget fills while time passes; then the dispatcher is woken (as
    // Engine::Expect does) and, finding nothing, spins again.
    rig.clock.Advance(gap);
    rig.queues.Expect();
  }
  const IdleSpinCounts s = rig.spins();
  const absl::Duration elapsed = rig.clock.Peek() - rig.start;
  INFO("spun " << absl::FormatDuration(s.spun) << " of " << absl::FormatDuration(elapsed)
               << ", first " << absl::FormatDuration(each.front()) << ", last "
               << absl::FormatDuration(each.back()));
  // The first spins have the banked budget: the whole configured time.
  CHECK(each.front() >= spin);
  CHECK(each.front() <= spin + step);
  // Never more than the share of the time plus what was banked (and a step per spin).
  CHECK(s.spun <= elapsed * share + kIdleSpinBudgetWindow * share + step * kCycles);
  CHECK(s.spun >= elapsed * share);  // the budget is used, not wasted
  // Then the budget cuts them to what 2 ms asleep (and the spin itself) refill:
  // share x gap / (1 - share) = 222 us.
  CHECK(s.cut >= kCycles - 3);
  CHECK(s.refused == 0);
  CHECK(s.hits == 0);
  CHECK(each.back() >= absl::Microseconds(215));
  CHECK(each.back() <= absl::Microseconds(240));
}

TEST_CASE("idle spin: zero time or a zero budget never spins; work still wakes the dispatcher") {
  std::mt19937_64 rng(44);
  {
    SpinRig rig(SpinOptions(0, 1.0), absl::Microseconds(1));
    REQUIRE(rig.RunJob(rng));
    REQUIRE(rig.RunJob(rng));
    CHECK(rig.spins().began == 0);
    CHECK(rig.spins().refused == 0);
  }
  {
    SpinRig rig(SpinOptions(1000, 0.0), absl::Microseconds(1));
    REQUIRE(rig.RunJob(rng));
    REQUIRE(rig.RunJob(rng));
    CHECK(rig.spins().began == 0);
    CHECK(rig.spins().refused >= 2);  // refused by the budget, each time it went idle
    CHECK(rig.spins().spun == absl::ZeroDuration());
  }
}

TEST_CASE("predictive wake: at a steady cadence it spins around the next job, then sleeps") {
  std::mt19937_64 rng(45);
  // No idle spin after each job: every spin below is predictive wake's. A 20 ms cadence in the
  // stepping clock's time, a 2 ms tolerance: the window (margin 50 us + the assumed 100 us
  // overshoot + 2 ms) is within a quarter of the gap, and at 1 ns a reading the spin lasts long
  // enough in real time for the test to enqueue into it.
  CudaEngineOptions o = SpinOptions(0, 1.0);
  o.predictive_wake = true;
  o.wake.tolerance = absl::Milliseconds(2);
  SpinRig rig(o, absl::Nanoseconds(1));
  const absl::Duration gap = absl::Milliseconds(20);
  // Learning: the first gaps are slept through (no spin).
  for (size_t k = 0; k < PredictiveWake::kMinGaps; ++k) {
    rig.clock.Advance(gap);
    REQUIRE(rig.RunJob(rng));
  }
  CHECK(rig.spins().began == 0);
  rig.clock.Advance(gap);
  REQUIRE(rig.RunJob(rng));
  // Predicted: the clock moves to within the next job's window; the dispatcher (asleep until
  // it, or there already) spins, and the job that comes ends the spin.
  for (uint64_t k = 1; k <= 4; ++k) {
    rig.clock.Advance(gap - absl::Microseconds(100));
    REQUIRE(SpinRig::WaitFor([&] { return rig.spins().began == k; }));
    REQUIRE(rig.RunJob(rng));
    REQUIRE(SpinRig::WaitFor([&] { return rig.spins().ended == k; }));
    CHECK(rig.spins().hits == k);
    CHECK(rig.spins().predicted_hits == k);
  }
  CHECK(rig.stats.Describe(0, 8, 0).find("predictive wake: 4 of them, 4 ended by work") !=
        std::string::npos);
  CHECK(rig.stats.Gauges().at("dispatcher_predicted_spin_hits_total") == 4);
  // The cadence stops: the next predicted spin misses, then the dispatcher sleeps for good.
  rig.clock.Advance(gap - absl::Microseconds(100));
  REQUIRE(SpinRig::WaitFor([&] { return rig.spins().ended == 5; }));
  CHECK(rig.spins().hits == 4);
  CHECK(rig.spins().predicted == 5);
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(rig.spins().began == 5);
}

}  // namespace
}  // namespace kvrail::engine::cuda_detail
