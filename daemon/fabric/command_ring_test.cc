// The command ring and slot credits: wraparound, ring credits (full ring refuses), epochs (a
// stale slot from an earlier lap is never taken), many producers with one consumer.
#include "daemon/fabric/command_ring.h"

#include <catch2/catch.hpp>
#include <set>
#include <thread>
#include <vector>

namespace kvrail::fabric {
namespace {

kernels::NicCommand Cmd(uint32_t tile) {
  kernels::NicCommand c{};
  c.opcode = kOpWriteTile;
  c.tile = tile;
  c.bytes = tile * 3;
  c.transfer_tag = 0x1234'0000'0000'0000ull + tile;
  return c;
}

TEST_CASE("capacity must be a power of two") {
  CHECK_FALSE(CommandRing::Create(0).ok());
  CHECK_FALSE(CommandRing::Create(6).ok());
  CHECK(CommandRing::Create(8).ok());
}

TEST_CASE("commands come out in order across many wraparounds, with lap epochs") {
  auto ring = *CommandRing::Create(4);
  uint32_t next_in = 0, next_out = 0;
  for (int round = 0; round < 1000; ++round) {
    const int burst = 1 + round % 4;
    for (int i = 0; i < burst; ++i) REQUIRE(ring->TryPush(Cmd(next_in++)));
    for (int i = 0; i < burst; ++i) {
      auto c = ring->Pop();
      REQUIRE(c.has_value());
      CHECK(c->tile == next_out);
      CHECK(c->bytes == next_out * 3);
      CHECK(c->transfer_tag == 0x1234'0000'0000'0000ull + next_out);
      CHECK(c->epoch == CommandRing::EpochOf(next_out, 4));
      ++next_out;
    }
    CHECK_FALSE(ring->Pop().has_value());
  }
  CHECK(ring->consumed() == next_out);
  CHECK(CommandRing::EpochOf(next_out, 4) > 200);  // epochs grew; nothing was reset
}

TEST_CASE("a full ring refuses until the consumer returns credit") {
  auto ring = *CommandRing::Create(8);
  for (uint32_t i = 0; i < 8; ++i) REQUIRE(ring->TryPush(Cmd(i)));
  CHECK_FALSE(ring->TryPush(Cmd(99)));
  CHECK(ring->Pending() == 8);
  REQUIRE(ring->Pop()->tile == 0);
  CHECK(ring->TryPush(Cmd(8)));
  CHECK_FALSE(ring->TryPush(Cmd(100)));
  for (uint32_t i = 1; i <= 8; ++i) REQUIRE(ring->Pop()->tile == i);
  CHECK_FALSE(ring->Pop().has_value());
}

TEST_CASE("many producers, one consumer: every command exactly once") {
  auto ring = *CommandRing::Create(16);
  constexpr int kProducers = 4, kEach = 20000;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kEach; ++i) {
        while (!ring->TryPush(Cmd(static_cast<uint32_t>(p * kEach + i)))) std::this_thread::yield();
      }
    });
  }
  std::vector<int> last(kProducers, -1);
  std::set<uint32_t> seen;
  while (seen.size() < size_t{kProducers} * kEach) {
    auto c = ring->Pop();
    if (!c) {
      std::this_thread::yield();
      continue;
    }
    REQUIRE(seen.insert(c->tile).second);
    const int p = static_cast<int>(c->tile / kEach), i = static_cast<int>(c->tile % kEach);
    REQUIRE(i > last[p]);  // per-producer order is kept
    last[p] = i;
  }
  for (auto& t : producers) t.join();
  CHECK_FALSE(ring->Pop().has_value());
}

TEST_CASE("slot credits: a slot is reused only after the peer returns its latest use") {
  uint64_t words[3] = {0, 0, 0};
  SlotCredits credits(3, words);
  CHECK(credits.Acquire() == 0);
  CHECK(credits.Acquire() == 1);
  CHECK(credits.Acquire() == 2);
  CHECK(credits.Acquire() == -1);
  words[1] = 1;  // the peer consumed slot 1's first use (an RMA write, here a store)
  CHECK(credits.Returned(1));
  CHECK(credits.Acquire() == 1);
  CHECK(credits.used(1) == 2);
  CHECK_FALSE(credits.Returned(1));
  CHECK(credits.Acquire() == -1);
  credits.ReturnLocally(2);  // the use never reached the wire
  CHECK(credits.Acquire() == 2);
  words[0] = 1;
  words[1] = 2;
  CHECK(credits.Returned(0));
  CHECK(credits.Returned(1));
  credits.Rebase();  // the peer restarted
  CHECK(credits.used(0) == 0);
  CHECK(words[0] == 0);
  CHECK(credits.Acquire() == 0);
}

TEST_CASE("slot credits: 'not applied' is read from the credit word (forgeable imm bits are not)") {
  uint64_t words[2] = {0, 0};
  SlotCredits credits(2, words);
  CHECK(credits.Acquire() == 0);
  CHECK_FALSE(credits.Returned(0));  // a completion naming slot 0 now was not sent by the peer
  words[0] = 1 | kCreditNotApplied;  // the peer consumed the use and dropped its tile
  CHECK(credits.Returned(0));
  CHECK(credits.credit(0) == 1);
  CHECK(credits.NotApplied(0));
  CHECK(credits.Acquire() == 0);
  words[0] = 2;  // the next use applied
  CHECK(credits.Returned(0));
  CHECK_FALSE(credits.NotApplied(0));
}

}  // namespace
}  // namespace kvrail::fabric
