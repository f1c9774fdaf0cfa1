// CI's check of the fabric kernels (kernels/fabric_pack.cu) without a GPU: their arithmetic
// (kernels/fabric_math.h, the very functions the kernels call) run by the host twin must put every
// byte where the fabric's host pack puts it (PackTileHost / UnpackTileHost, planner::
// ForEachTileRun) for random layouts, at the plan's access width and every narrower one; the
// command the kernel publishes must be the command the CPU path posts; and the ring protocol the
// kernel follows (host-reserved sequence numbers, body then epoch with release, published in any
// order, kOpNone for a producer that gave up) must deliver every command once, in order.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "daemon/fabric/command_ring.h"
#include "daemon/fabric/tile_pack.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/fabric_math.h"

namespace kvrail::fabric {
namespace {

namespace k = ::kvrail::kernels;
using planner::testing::RandomCase;

void CheckCase(const RandomCase& c, std::mt19937_64& rng) {
  INFO(c.ToString());
  auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  const k::PlanHeader& h = plan->header();
  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> host_dst(c.dst.size_bytes, 0xAB), twin_dst(c.dst.size_bytes, 0xAB);
  std::vector<uint8_t> want, got;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    const uint64_t n = TileBytes(*plan, t);
    want.assign(n, 0x11);
    PackTileHost(*plan, t, src.data(), want.data());
    // Every width the kernel may run at (the plan's, narrowed by base alignments).
    for (uint32_t w = h.access_bytes; w >= 1; w /= 2) {
      INFO("tile " << t << " width " << w);
      REQUIRE(n % w == 0);
      got.assign(n, 0x22);
      k::FabricPackTileTwin(h, plan->src_blocks().data(), plan->dst_blocks().data(), t, w,
                            src.data(), got.data());
      REQUIRE(got == want);
    }
    UnpackTileHost(*plan, t, want.data(), host_dst.data());
    k::FabricUnpackTileTwin(h, plan->src_blocks().data(), plan->dst_blocks().data(), t,
                            h.access_bytes, want.data(), twin_dst.data());
    // The command: what the sender's CPU path posts for this tile (sender.cc PackLoop).
    k::NicCommand engine{};
    engine.peer = static_cast<uint16_t>(rng() % 65536);
    engine.remote_handle = static_cast<uint16_t>(rng() % 65536);
    engine.transfer_tag = rng();
    const uint32_t slot = static_cast<uint32_t>(rng() % 256);
    const k::NicCommand cmd = k::FabricTileCommand(h, t, slot, engine);
    CHECK(cmd.opcode == kOpWriteTile);
    CHECK(cmd.tile == t);
    CHECK(cmd.slot == slot);
    CHECK(cmd.peer == engine.peer);
    CHECK(cmd.remote_handle == engine.remote_handle);
    CHECK(cmd.transfer_tag == engine.transfer_tag);
    CHECK(cmd.bytes == n);
    CHECK(cmd.epoch == 0);
  }
  CHECK(twin_dst == host_dst);
}

TEST_CASE("fabric kernel twin packs and unpacks as the host pack on random paged cases") {
  std::mt19937_64 rng(19);
  for (int i = 0; i < 300; ++i) CheckCase(planner::testing::RandomPagedCase(rng), rng);
}

TEST_CASE("fabric kernel twin packs and unpacks as the host pack on random bytes cases") {
  std::mt19937_64 rng(20);
  for (int i = 0; i < 100; ++i) CheckCase(planner::testing::RandomBytesCase(rng), rng);
}

TEST_CASE("the comparison sees a twin reading one byte off") {
  std::mt19937_64 rng(7);
  int compared = 0;
  for (int i = 0; i < 200 && compared < 20; ++i) {
    RandomCase c = planner::testing::RandomPagedCase(rng);
    auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    if (plan->chunk_kind() == k::ChunkKind::kBytes || plan->num_tiles() == 0 ||
        plan->src_per_layer()) {
      continue;
    }
    const uint64_t n = TileBytes(*plan, 0);
    if (n < 2) continue;
    std::vector<uint8_t> src(c.src.size_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> want(n), got(n);
    PackTileHost(*plan, 0, src.data(), want.data());
    // One byte off: the comparison must see it (random bytes: equal only by chance).
    k::FabricPackTileTwin(plan->header(), plan->src_blocks().data(), plan->dst_blocks().data(), 0,
                          1, src.data() + 1, got.data());
    CHECK(got != want);
    ++compared;
  }
  CHECK(compared == 20);
}

// What the kernel does to publish (kernels/fabric_pack.cu PublishCommand), on the host: the body
// words, then the epoch with a release store.
void DevicePublish(CommandRing& ring, uint64_t seq, const k::NicCommand& body) {
  k::NicCommand* slot = ring.SlotAt(seq);
  std::memcpy(static_cast<void*>(slot), &body, offsetof(k::NicCommand, epoch));
  reinterpret_cast<std::atomic<uint32_t>*>(&slot->epoch)
      ->store(CommandRing::EpochOf(seq, ring.capacity()), std::memory_order_release);
}

k::NicCommand Tile(uint32_t t) {
  k::NicCommand c{};
  c.opcode = kOpWriteTile;
  c.tile = t;
  return c;
}

TEST_CASE("ring: reserved numbers published out of order are taken in order") {
  auto ring = CommandRing::Create(8);
  REQUIRE(ring.ok());
  for (int lap = 0; lap < 5; ++lap) {
    std::vector<uint64_t> seqs;
    for (int i = 0; i < 8; ++i) {
      auto s = (*ring)->Reserve();
      REQUIRE(s.has_value());
      seqs.push_back(*s);
    }
    CHECK_FALSE((*ring)->Reserve().has_value());  // full: no credit
    CHECK_FALSE((*ring)->TryPush(Tile(99)));
    // Published last to first: nothing is taken until the first is.
    for (int i = 7; i >= 1; --i) {
      DevicePublish(**ring, seqs[i], Tile(lap * 8 + i));
      CHECK_FALSE((*ring)->Pop().has_value());
    }
    DevicePublish(**ring, seqs[0], Tile(lap * 8));
    for (int i = 0; i < 8; ++i) {
      auto c = (*ring)->Pop();
      REQUIRE(c.has_value());
      CHECK(c->tile == static_cast<uint32_t>(lap * 8 + i));
    }
    CHECK_FALSE((*ring)->Pop().has_value());
  }
}

TEST_CASE("ring: a producer that gave up publishes kOpNone, which the consumer skips") {
  auto ring = CommandRing::Create(4);
  REQUIRE(ring.ok());
  const uint64_t a = *(*ring)->Reserve();
  const uint64_t b = *(*ring)->Reserve();
  const uint64_t c = *(*ring)->Reserve();
  DevicePublish(**ring, c, Tile(3));
  DevicePublish(**ring, a, Tile(1));
  REQUIRE((*ring)->Pop()->tile == 1);
  CHECK_FALSE((*ring)->Pop().has_value());  // b not published: the consumer waits at it
  (*ring)->PublishNone(b);
  REQUIRE((*ring)->Pop()->tile == 3);
  CHECK_FALSE((*ring)->Pop().has_value());
  CHECK((*ring)->consumed() == 3);
}

TEST_CASE("ring: a stale epoch from the previous lap is not taken") {
  auto ring = CommandRing::Create(2);
  REQUIRE(ring.ok());
  for (uint32_t i = 0; i < 2; ++i) REQUIRE((*ring)->TryPush(Tile(i)));
  for (uint32_t i = 0; i < 2; ++i) REQUIRE((*ring)->Pop()->tile == i);
  // Lap 2: the slot still holds lap 1's epoch and body.
  const uint64_t s = *(*ring)->Reserve();
  CHECK(CommandRing::EpochOf(s, 2) == 2);
  CHECK_FALSE((*ring)->Pop().has_value());
  DevicePublish(**ring, s, Tile(7));
  CHECK((*ring)->Pop()->tile == 7);
}

TEST_CASE("ring: 4 device-style producers x 5000 reserved commands, each taken once in order") {
  auto ring = CommandRing::Create(64);
  REQUIRE(ring.ok());
  constexpr int kProducers = 4, kEach = 5000;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      std::mt19937 rng(p);
      for (int i = 0; i < kEach; ++i) {
        std::optional<uint64_t> seq;
        while (!(seq = (*ring)->Reserve())) std::this_thread::yield();
        if (rng() % 8 == 0) std::this_thread::yield();  // publish late, sometimes
        k::NicCommand c = Tile(static_cast<uint32_t>(i));
        c.peer = static_cast<uint16_t>(p);
        DevicePublish(**ring, *seq, c);
      }
    });
  }
  std::vector<int> next(kProducers, 0);
  int taken = 0;
  while (taken < kProducers * kEach) {
    auto c = (*ring)->Pop();
    if (!c) {
      std::this_thread::yield();
      continue;
    }
    REQUIRE(c->peer < kProducers);
    REQUIRE(c->tile == static_cast<uint32_t>(next[c->peer]));  // per-producer order
    ++next[c->peer];
    ++taken;
  }
  for (auto& t : producers) t.join();
  CHECK_FALSE((*ring)->Pop().has_value());
  for (int p = 0; p < kProducers; ++p) CHECK(next[p] == kEach);
}

}  // namespace
}  // namespace kvrail::fabric
