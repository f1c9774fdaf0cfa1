// Lane failover's pure part: which lanes fail and when (write errors, silence measured against
// the other lanes, the all-silent fallback), which slots' tiles are handed back for re-sending,
// the cool-down and the one-tile probe, and when no lane is left. Time is a manual clock.
#include "daemon/fabric/lane_health.h"

#include "base/manual_clock.h"
#include "catch2/catch.hpp"

namespace kvrail::fabric {
namespace {

constexpr absl::Duration kTimeout = absl::Milliseconds(200);
constexpr absl::Duration kCooldown = absl::Seconds(2);
constexpr absl::Duration kPeerTimeout = absl::Seconds(3);

TEST_CASE("a silent lane fails while the others return credits; its waiting slots come back") {
  ManualClock clock;
  LaneHealth h(4, 8, kTimeout, kCooldown, kPeerTimeout);
  for (uint32_t lane = 0; lane < 4; ++lane) {
    REQUIRE(h.MayUse(lane, clock.Now()));
    h.OnSent(lane, 0, clock.Now());
    h.OnSent(lane, 3, clock.Now());
  }
  clock.Advance(absl::Milliseconds(50));
  // Lanes 0, 1 and 3 keep returning credits (and get new tiles); lane 2 goes quiet.
  for (int step = 0; step < 4; ++step) {
    for (uint32_t lane : {0u, 1u, 3u}) {
      h.OnCredit(lane, 0, clock.Now());
      h.OnSent(lane, 0, clock.Now());
    }
    CHECK(h.Silent(clock.Now()).empty());  // < 200 ms of quiet on lane 2 so far
    clock.Advance(absl::Milliseconds(40));
  }
  clock.Advance(absl::Milliseconds(20));  // lane 2: 230 ms since its tiles went out
  const auto silent = h.Silent(clock.Now());
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].first == 2);
  CHECK(silent[0].second.find("while other lanes returned them") != std::string::npos);
  const std::vector<uint32_t> resend = h.Fail(2, clock.Now(), silent[0].second);
  CHECK(resend == std::vector<uint32_t>{0, 3});  // the tiles in slots 0 and 3 go elsewhere
  CHECK(h.state(2) == LaneState::kFailed);
  CHECK(h.failovers() == 1);
  CHECK(h.waiting(2) == 0);
  CHECK_FALSE(h.MayUse(2, clock.Now()));
  CHECK(h.Fail(2, clock.Now(), "again").empty());  // already failed: nothing, no new failover
  CHECK(h.failovers() == 1);
  CHECK(h.AnyLeft(clock.Now()));
  CHECK(h.Describe().find("lane 2 failed: no credit for 230 ms") != std::string::npos);
}

TEST_CASE("another lane's credit from before the silence began is no evidence against the lane") {
  ManualClock clock;
  LaneHealth h(2, 4, kTimeout, kCooldown, kPeerTimeout);
  h.OnSent(0, 0, clock.Now());
  h.OnCredit(0, 0, clock.Now());  // lane 0's last credit
  clock.Advance(absl::Milliseconds(1));
  h.OnSent(1, 0, clock.Now());  // lane 1's silence begins after it
  clock.Advance(absl::Milliseconds(250));
  CHECK(h.Silent(clock.Now()).empty());  // the peer may be what is slow: nobody is blamed
  h.OnSent(0, 1, clock.Now());
  h.OnCredit(0, 1, clock.Now());  // now lane 0 progresses while lane 1 waits
  REQUIRE(h.Silent(clock.Now()).size() == 1);
}

TEST_CASE("all lanes silent together is the peer's matter until the peer timeout") {
  ManualClock clock;
  LaneHealth h(2, 4, kTimeout, kCooldown, kPeerTimeout);
  h.OnSent(0, 1, clock.Now());
  h.OnSent(1, 2, clock.Now());
  clock.Advance(absl::Seconds(1));
  CHECK(h.Silent(clock.Now()).empty());  // a slow receiver: no lane is blamed
  clock.Advance(absl::Seconds(2));
  const auto silent = h.Silent(clock.Now());
  REQUIRE(silent.size() == 2);
  CHECK(silent[0].second.find("no lane to the peer returns any") != std::string::npos);
}

TEST_CASE("an idle lane is never silent, and silence counts from its first tile out") {
  ManualClock clock;
  LaneHealth h(2, 4, kTimeout, kCooldown, kPeerTimeout);
  h.OnSent(0, 0, clock.Now());
  h.OnCredit(0, 0, clock.Now());
  clock.Advance(absl::Seconds(10));  // both idle for long
  CHECK(h.Silent(clock.Now()).empty());
  h.OnSent(1, 0, clock.Now());  // lane 1 starts now
  h.OnSent(0, 0, clock.Now());
  clock.Advance(absl::Milliseconds(150));
  h.OnCredit(0, 0, clock.Now());
  CHECK(h.Silent(clock.Now()).empty());  // lane 1: 150 ms only
  clock.Advance(absl::Milliseconds(60));
  const auto silent = h.Silent(clock.Now());
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].first == 1);
}

TEST_CASE("a write error fails the lane at once; a released slot is no longer waited on") {
  ManualClock clock;
  LaneHealth h(3, 4, kTimeout, kCooldown, kPeerTimeout);
  h.OnSent(1, 0, clock.Now());
  h.OnSent(1, 1, clock.Now());
  h.OnSent(1, 2, clock.Now());
  h.OnReleased(1, 1);  // its write never reached the wire: the caller re-sends that one itself
  CHECK(h.waiting(1) == 2);
  CHECK(h.Fail(1, clock.Now(), "write error: connection reset") == std::vector<uint32_t>{0, 2});
  CHECK(h.why(1) == "write error: connection reset");
}

TEST_CASE("after the cool-down one probe tile goes out; its credit brings the lane up") {
  ManualClock clock;
  LaneHealth h(2, 4, kTimeout, kCooldown, kPeerTimeout);
  (void)h.Fail(0, clock.Now(), "write error");
  clock.Advance(kCooldown - absl::Milliseconds(1));
  CHECK_FALSE(h.MayUse(0, clock.Now()));
  clock.Advance(absl::Milliseconds(1));
  REQUIRE(h.MayUse(0, clock.Now()));
  CHECK(h.state(0) == LaneState::kProbing);
  h.OnSent(0, 3, clock.Now());
  CHECK_FALSE(h.MayUse(0, clock.Now()));  // one probe at a time
  CHECK(h.MayUse(1, clock.Now()));
  clock.Advance(absl::Milliseconds(5));
  h.OnCredit(0, 3, clock.Now());
  CHECK(h.state(0) == LaneState::kUp);
  CHECK(h.MayUse(0, clock.Now()));
  CHECK(h.failovers() == 1);
}

TEST_CASE("a probe that is not credited fails the lane again without the other lanes' evidence") {
  ManualClock clock;
  LaneHealth h(2, 4, kTimeout, kCooldown, kPeerTimeout);
  (void)h.Fail(0, clock.Now(), "write error");
  clock.Advance(kCooldown);
  REQUIRE(h.MayUse(0, clock.Now()));
  h.OnSent(0, 2, clock.Now());
  clock.Advance(kTimeout);
  const auto silent = h.Silent(clock.Now());
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].second.find("probe tile not credited") != std::string::npos);
  CHECK(h.Fail(0, clock.Now(), silent[0].second) == std::vector<uint32_t>{2});
  CHECK(h.failovers() == 1);  // the same failover, not a new one
  CHECK_FALSE(h.MayUse(0, clock.Now() + absl::Milliseconds(1)));  // a fresh cool-down
}

TEST_CASE("no lane is left only when every lane failed and rests") {
  ManualClock clock;
  LaneHealth h(2, 4, kTimeout, kCooldown, kPeerTimeout);
  (void)h.Fail(0, clock.Now(), "a");
  CHECK(h.AnyLeft(clock.Now()));
  clock.Advance(absl::Milliseconds(500));
  (void)h.Fail(1, clock.Now(), "b");
  CHECK_FALSE(h.AnyLeft(clock.Now()));
  clock.Advance(absl::Milliseconds(1500));  // lane 0 has rested: it may be probed
  CHECK(h.AnyLeft(clock.Now()));
  CHECK(h.failovers() == 2);
}

}  // namespace
}  // namespace kvrail::fabric
