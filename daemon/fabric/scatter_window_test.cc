// The receiver's scatters in flight (scatter_window.h): each arrival is credited
// when ITS kernel has ended, in any order, several in flight at once; a repeat whose first copy
// is in flight waits for it without blocking; simulated with fake kernels ending at random ticks.
#include "daemon/fabric/scatter_window.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <optional>
#include <random>
#include <vector>

namespace kvrail::fabric {
namespace {

struct Entry {
  uint32_t tile = 0;
  uint32_t slot = 0;
  uint64_t ends_at = 0;  // the fake kernel's end (tick)
  bool repeat = false;
};

TEST_CASE("scatter window: wait policy") {
  CHECK(ScatterWindow<Entry>::WaitFor(true) == absl::InfiniteDuration());
  CHECK(ScatterWindow<Entry>::WaitFor(false) == absl::Microseconds(20));
  CHECK(ScatterWindow<Entry>::WaitFor(false, absl::Microseconds(5)) == absl::Microseconds(5));
}

TEST_CASE("scatter window: credits each slot when its own kernel ended, out of order") {
  std::mt19937_64 rng(19);
  for (int round = 0; round < 200; ++round) {
    const uint32_t slots = 1 + rng() % 16, tiles = 1 + rng() % 200;
    ScatterWindow<Entry> window;
    std::vector<bool> slot_busy(slots, false);
    std::vector<int> credited(tiles, 0);
    std::vector<bool> landed(tiles, false);
    uint64_t now = 0;
    uint32_t next = 0;
    size_t most_in_flight = 0;
    bool out_of_order = false;
    uint32_t last_credited = 0;
    bool any_credited = false;
    while (next < tiles || !window.empty()) {
      // Arrivals into free slots (a slot is refilled only after its credit).
      for (uint32_t s = 0; s < slots && next < tiles; ++s) {
        if (slot_busy[s] || rng() % 3 == 0) continue;
        slot_busy[s] = true;
        window.Add(Entry{next++, s, now + 1 + rng() % 50, false});
      }
      most_in_flight = std::max(most_in_flight, window.size());
      const size_t before = window.size();
      const size_t retired = window.Poll(
          [&](Entry& e) -> std::optional<bool> {
            if (now < e.ends_at) return std::nullopt;
            return true;
          },
          [&](Entry& e, bool applied) {
            REQUIRE(applied);
            REQUIRE(now >= e.ends_at);  // never before its kernel ended
            REQUIRE(slot_busy[e.slot]);
            slot_busy[e.slot] = false;
            ++credited[e.tile];
            if (any_credited && e.tile < last_credited) out_of_order = true;
            last_credited = e.tile;
            any_credited = true;
          });
      REQUIRE(window.size() + retired == before);
      ++now;
    }
    for (uint32_t t = 0; t < tiles; ++t) REQUIRE(credited[t] == 1);
    if (slots > 2 && tiles > 20) {
      CHECK(most_in_flight > 1);
      CHECK(out_of_order);
    }
  }
}

TEST_CASE("scatter window: a repeat waits for its first copy, in the same pass when it lands") {
  ScatterWindow<Entry> window;
  std::vector<bool> landed(4, false);
  std::vector<uint32_t> order;
  window.Add(Entry{2, 0, 5, false});  // first copy of tile 2, kernel ends at tick 5
  window.Add(Entry{2, 1, 0, true});   // its repeat (lane failover), added after
  window.Add(Entry{3, 2, 9, false});
  auto done = [&](uint64_t now) {
    return [&landed, now](Entry& e) -> std::optional<bool> {
      if (e.repeat) return landed[e.tile] ? std::optional<bool>(true) : std::nullopt;
      if (now < e.ends_at) return std::nullopt;
      return true;
    };
  };
  auto retire = [&](Entry& e, bool) {
    if (!e.repeat) landed[e.tile] = true;
    order.push_back(e.tile * 10 + (e.repeat ? 1 : 0));
  };
  CHECK(window.Poll(done(4), retire) == 0);  // nothing ended: the repeat is not credited
  CHECK(window.size() == 3);
  CHECK(window.Poll(done(5), retire) == 2);  // tile 2 lands, its repeat follows in the pass
  CHECK(order == std::vector<uint32_t>{20, 21});
  CHECK(window.size() == 1);
  CHECK(window.Poll(done(9), retire) == 1);
  CHECK(window.empty());
}

}  // namespace
}  // namespace kvrail::fabric
