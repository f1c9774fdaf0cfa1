#include "daemon/scheduler/tile_queues.h"

#include <array>
#include <catch2/catch.hpp>
#include <string>

namespace kvrail::scheduler {
namespace {

// A job whose plan is never read by these tests except in QueuedBytes (not called here).
class FakeJob final : public Job {
 public:
  explicit FakeJob(PriorityClass p) : p_(p) {}
  const planner::Plan& plan() const override { std::abort(); }
  const uint8_t* src_base() const override { return nullptr; }
  uint8_t* dst_base() const override { return nullptr; }
  PriorityClass priority() const override { return p_; }
  void OnTileStart(uint32_t) override {}
  void OnTileDone(uint32_t, const absl::Status&) override {}

 private:
  PriorityClass p_;
};

std::pair<std::shared_ptr<Job>, uint32_t> TakeOne(TileQueues& q) {
  for (int c = 0; c < kNumPriorityClasses; ++c) {
    if (q.Empty(c)) continue;
    return q.TakeFrom(c, [](const Job&, TileRanges& t) {
      const uint32_t x = t.front();
      t.pop_front();
      return x;
    });
  }
  return {nullptr, 0};
}

TEST_CASE("higher classes first; round robin within a class; removal counts") {
  TileQueues q;
  auto bg = std::make_shared<FakeJob>(PriorityClass::kBackground);
  auto a = std::make_shared<FakeJob>(PriorityClass::kNormal);
  auto b = std::make_shared<FakeJob>(PriorityClass::kNormal);
  auto crit = std::make_shared<FakeJob>(PriorityClass::kCritical);
  q.Add(bg, {0, 1, 2});
  q.Add(a, {10, 11});
  q.Add(b, {20, 21});
  q.Add(a, {12});  // appended to a's entry
  std::vector<uint64_t> counts(kNumPriorityClasses, 0);
  q.AddCounts(&counts);
  CHECK(counts == std::vector<uint64_t>{0, 5, 3});
  std::string order;
  auto take = [&] {
    auto [job, tile] = TakeOne(q);
    order += std::to_string(tile) + " ";
  };
  take();                         // a:10
  take();                         // b:20
  q.Add(crit, {99});              // a critical job arrives: it goes next
  take();                         // crit:99
  take();                         // a:11
  CHECK(q.Remove(b.get()) == 1);  // b:21 dropped
  CHECK(!q.Contains(b.get()));
  take();  // a:12
  take();  // bg:0 (only background left)
  CHECK(order == "10 20 99 11 12 0 ");
  CHECK(q.Remove(bg.get()) == 2);
  CHECK(q.AllEmpty());
}

TEST_CASE("fewest queued tiles first within a class; classes still first; ties by arrival") {
  TileQueues q(WithinClass::kFewestTilesFirst);
  auto big = std::make_shared<FakeJob>(PriorityClass::kNormal);
  auto next = std::make_shared<FakeJob>(PriorityClass::kNormal);
  auto small = std::make_shared<FakeJob>(PriorityClass::kNormal);
  auto crit = std::make_shared<FakeJob>(PriorityClass::kCritical);
  q.Add(big, {0, 1, 2, 3, 4, 5});
  q.Add(next, {10, 11, 12, 13, 14, 15});  // same size, later: waits for `big`
  std::string order;
  auto take = [&] {
    auto [job, tile] = TakeOne(q);
    order += std::to_string(tile) + " ";
  };
  take();                  // big:0 (ties go to the earlier job)
  take();                  // big:1 (now the fewest: 4 left against 6)
  q.Add(small, {20, 21});  // a short transfer passes
  take();                  // small:20
  q.Add(crit, {99});
  take();                                 // crit:99
  take();                                 // small:21
  take();                                 // big:2
  q.Add(next, {16, 17, 18, 19, 30, 31});  // layer-wise growth: `next` has 12 now, big 3
  take();                                 // big:3
  take();                                 // big:4
  take();                                 // big:5
  take();                                 // next:10
  CHECK(order == "0 1 20 99 21 2 3 4 5 10 ");
  CHECK(q.Remove(next.get()) == 11);
  CHECK(q.AllEmpty());
}

TEST_CASE("MayStart: a class with nothing in flight always starts; else within its limit") {
  ClassLimits none;
  CHECK(MayStart(none, 1ull << 40, 1ull << 40));
  ClassLimits limited;
  limited.max_inflight_bytes = 4 << 20;
  CHECK(MayStart(limited, 0, 64 << 20));  // alone, however large
  CHECK(MayStart(limited, 1 << 20, 3 << 20));
  CHECK_FALSE(MayStart(limited, 1 << 20, (3 << 20) + 1));
}

TEST_CASE("HostClassSlots: background leaves one worker free; one worker serves every class") {
  using Slots = std::array<int, kNumPriorityClasses>;
  CHECK(HostClassSlots(4) == Slots{4, 4, 3});
  CHECK(HostClassSlots(2) == Slots{2, 2, 1});
  CHECK(HostClassSlots(1) == Slots{1, 1, 1});
  CHECK(HostClassSlots(0) == Slots{1, 1, 1});  // fewer than one thread runs one
}

TEST_CASE("the drain's order: started jobs to their end one at a time, unstarted ones after") {
  TileQueues q;  // round robin until the drain
  auto a = std::make_shared<FakeJob>(PriorityClass::kNormal);
  auto b = std::make_shared<FakeJob>(PriorityClass::kNormal);
  auto c = std::make_shared<FakeJob>(PriorityClass::kNormal);
  q.Add(a, {0, 1, 2, 3, 4});
  q.Add(b, {10, 11, 12, 13});
  std::string order;
  auto take = [&] {
    auto [job, tile] = TakeOne(q);
    order += std::to_string(tile) + " ";
  };
  take();          // a:0
  take();          // b:10 (round robin)
  take();          // a:1
  q.Add(c, {20});  // not started: one tile, fewer than any started job
  q.FinishStartedFirst();
  // b has the fewest queued tiles of the started jobs (3 against a's 3: the earlier, b, is at the
  // front after the rotation) and runs to its end; then a; c, not started, last.
  for (int i = 0; i < 7; ++i) take();
  CHECK(order == "0 10 1 11 12 13 2 3 4 20 ");
  CHECK(q.AllEmpty());
}

}  // namespace
}  // namespace kvrail::scheduler
