#include "daemon/scheduler/tile_ranges.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

namespace kvrail::scheduler {
namespace {

TEST_CASE("a whole transfer's tiles are one range, not one entry per tile") {
  // One entry per tile: a 2^20-tile transfer would hold 2^20 deque entries in the queue that
  // carried it.
  std::vector<uint32_t> all(1u << 20);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  TileRanges q(all.begin(), all.end());
  CHECK(q.size() == all.size());
  CHECK(q.num_ranges() == 1);
  CHECK(q.front() == 0);
  q.pop_front();
  CHECK(q.front() == 1);
  CHECK(q.size() == all.size() - 1);
  CHECK(q.num_ranges() == 1);
}

TEST_CASE("behaves as a deque of ids under random pushes and pops") {
  std::mt19937 rng(17);
  for (int round = 0; round < 200; ++round) {
    TileRanges q;
    std::deque<uint32_t> ref;
    uint32_t next = rng() % 100;
    for (int op = 0; op < 300; ++op) {
      if (ref.empty() || rng() % 3 != 0) {
        // Mostly consecutive ids, sometimes a jump or a repeat, as re-queued tiles may be.
        const uint32_t r = rng() % 10;
        const uint32_t id = r == 0 ? next + 5 : r == 1 ? next - 1 : next;
        q.push_back(id);
        ref.push_back(id);
        next = id + 1;
      } else {
        REQUIRE(q.front() == ref.front());
        q.pop_front();
        ref.pop_front();
      }
      REQUIRE(q.size() == ref.size());
      REQUIRE(q.empty() == ref.empty());
    }
    std::vector<uint32_t> seen(q.begin(), q.end());
    REQUIRE(seen == std::vector<uint32_t>(ref.begin(), ref.end()));
    REQUIRE(q.num_ranges() <= ref.size());
  }
}

TEST_CASE("ids after a gap start a new range; insert_back extends") {
  TileRanges q;
  std::vector<uint32_t> a = {4, 5, 6, 10, 11};
  q.insert_back(a.begin(), a.end());
  CHECK(q.num_ranges() == 2);
  std::vector<uint32_t> b = {12, 13};
  q.insert_back(b.begin(), b.end());
  CHECK(q.num_ranges() == 2);
  CHECK(std::vector<uint32_t>(q.begin(), q.end()) ==
        std::vector<uint32_t>{4, 5, 6, 10, 11, 12, 13});
  for (int i = 0; i < 3; ++i) q.pop_front();
  CHECK(q.num_ranges() == 1);
  CHECK(q.front() == 10);
}

}  // namespace
}  // namespace kvrail::scheduler
