// The history's bound: the ended transfers it forgets are handed out (TakeEvicted) rather than
// destroyed by the Add that forgot them, so the manager destroys them outside its lock and off
// the admitting thread; at most History::kMaxEvicted wait, beyond which Add destroys them.
#include "daemon/transfers/history.h"

#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "base/manual_clock.h"
#include "daemon/planner/testing/plan_fixtures.h"
#include "daemon/transfers/fake_engine.h"
#include "daemon/transfers/test_support.h"

namespace kvrail::transfers {
namespace {

using planner::testing::BytesPlan;
using testing::FakeEngine;
using testing::TestRegions;

struct Fixture {
  ManualClock clock;
  TestRegions regions;
  FakeEngine engine;
  std::shared_ptr<Counters> counters = std::make_shared<Counters>();
  std::shared_ptr<regions::Region> src = regions.Bytes(4096, false);
  std::shared_ptr<regions::Region> dst = regions.Bytes(4096, true);

  // An ended (cancelled) record with id `id`.
  std::shared_ptr<Record> Ended(uint64_t id) {
    RecordParams params;
    params.id = id;
    params.src = src;
    params.dst = dst;
    params.engine = &engine;
    params.counters = counters;
    params.clock = &clock;
    {
      absl::MutexLock c(&counters->mu);
      ++counters->active;
    }
    auto record = std::make_shared<Record>(BytesPlan(4096, 1024), std::move(params));
    const size_t tiles = record->TakeInitialTiles().size();
    REQUIRE(record->RequestEnd(absl::CancelledError("ended for the test"), tiles));
    REQUIRE(record->IsFinal());
    return record;
  }
};

TEST_CASE("the history hands out the records it forgets; they live until taken and dropped") {
  Fixture f;
  History history(2);
  std::vector<std::weak_ptr<Record>> weak;
  for (uint64_t id = 1; id <= 5; ++id) {
    std::shared_ptr<Record> record = f.Ended(id);
    weak.push_back(record);
    history.Add(record, "");
  }
  // Ids 1-3 are forgotten (limit 2) but not destroyed by the Adds that forgot them.
  CHECK(history.size() == 2);
  for (uint64_t id = 1; id <= 3; ++id) {
    CHECK(history.Find(id) == nullptr);
    CHECK_FALSE(weak[id - 1].expired());
  }
  std::vector<std::shared_ptr<Record>> evicted = history.TakeEvicted();
  REQUIRE(evicted.size() == 3);
  CHECK(evicted[0]->id() == 1);
  CHECK(evicted[2]->id() == 3);
  CHECK(history.TakeEvicted().empty());  // taken once
  evicted.clear();
  for (uint64_t id = 1; id <= 3; ++id) CHECK(weak[id - 1].expired());
  CHECK(history.Find(4) != nullptr);
  CHECK(history.Find(5) != nullptr);
}

TEST_CASE("records forgotten beyond kMaxEvicted, never taken, are destroyed by the Add") {
  Fixture f;
  History history(0);  // every ended record is forgotten as it is added
  std::vector<std::weak_ptr<Record>> weak;
  const uint64_t count = History::kMaxEvicted + 10;
  for (uint64_t id = 1; id <= count; ++id) {
    std::shared_ptr<Record> record = f.Ended(id);
    weak.push_back(record);
    history.Add(record, "");
  }
  size_t alive = 0;
  for (const auto& w : weak) alive += w.expired() ? 0 : 1;
  CHECK(alive == History::kMaxEvicted);  // the first kMaxEvicted wait; the rest went at once
  CHECK(weak.back().expired());
  CHECK(history.TakeEvicted().size() == History::kMaxEvicted);
}

}  // namespace
}  // namespace kvrail::transfers
