// One transfer's record: tile accounting at its end (inbound records ended while tiles land).
#include "daemon/transfers/record.h"

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/manual_clock.h"
#include "daemon/planner/testing/plan_fixtures.h"
#include "daemon/transfers/fake_engine.h"
#include "daemon/transfers/test_support.h"

namespace kvrail::transfers {
namespace {

using testing::FakeEngine;
using testing::TestRegions;

using planner::testing::BytesPlan;

// A record of 4096 bytes in tiles of `tile` bytes, counted active as admission counts it.
struct Fixture {
  ManualClock clock;
  TestRegions regions;
  FakeEngine engine;
  std::shared_ptr<Counters> counters = std::make_shared<Counters>();
  std::shared_ptr<Record> record;

  Fixture(bool inbound, uint64_t tile,
          std::function<void(const v1::TransferStatus&)> on_finished = nullptr,
          v1::TransferSpec spec = {}) {
    counters->on_finished = std::move(on_finished);
    RecordParams params;
    params.id = 7;
    params.spec = std::move(spec);
    params.path_reason = "same node";
    params.link = "host";
    params.src = regions.Bytes(4096, false);
    params.dst = regions.Bytes(4096, true);
    params.engine = &engine;
    params.counters = counters;
    params.clock = &clock;
    params.inbound = inbound;
    {
      absl::MutexLock c(&counters->mu);
      ++counters->active;
    }
    record = std::make_shared<Record>(BytesPlan(4096, tile), std::move(params));
  }
};

struct InboundFixture : Fixture {
  InboundFixture() : Fixture(/*inbound=*/true, 1024) {
    REQUIRE(record->TakeInitialTiles().size() == 4);  // all expected from the fabric
  }
};

TEST_CASE("an inbound record ends even when a tile lands between the engine's count and the end") {
  // The old End(): the inbound engine counted 4 unreported tiles, tile 0 landed, then RequestEnd
  // added the stale 4: 5 reported of 4 enqueued, the == check never held, the record never ended
  // and Drain waited for it for ever.
  InboundFixture f;
  const size_t stale_removed = 4;
  f.record->OnTileStart(0);
  f.record->OnTileDone(0, absl::OkStatus());
  REQUIRE(f.record->RequestEnd(absl::UnavailableError("drained"), stale_removed));
  CHECK(f.record->IsFinal());
  CHECK(f.record->Ended());
  const v1::TransferStatus status = f.record->Status();
  CHECK(status.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(status.tiles_done() == 1);
  absl::MutexLock c(&f.counters->mu);
  CHECK(f.counters->active == 0);
  CHECK(f.counters->failed == 1);
}

TEST_CASE("tiles reported after an inbound record ended change nothing") {
  InboundFixture f;
  f.record->OnTileStart(0);
  f.record->OnTileDone(0, absl::OkStatus());
  REQUIRE(f.record->RequestEnd(absl::UnavailableError("sender gone"), 0));
  REQUIRE(f.record->Ended());
  const uint64_t version = f.record->version();
  for (uint32_t t = 1; t < 4; ++t) {
    f.record->OnTileStart(t);
    f.record->OnTileDone(t, absl::OkStatus());
  }
  const v1::TransferStatus status = f.record->Status();
  CHECK(status.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(status.tiles_done() == 1);
  CHECK(status.bytes_done() == 1024);
  CHECK(f.record->version() == version);
  CHECK_FALSE(f.record->RequestEnd(absl::CancelledError("again"), 0));
  absl::MutexLock c(&f.counters->mu);
  CHECK(f.counters->failed == 1);
  CHECK(f.counters->succeeded == 0);
}

TEST_CASE("a transfer's waiters hear of its end before the metrics hook runs") {
  // The WAIT's DONE is sent from a waiter callback: the metrics and the log line (on_finished)
  // come after it, off the client's critical path.
  std::vector<std::string> order;
  Fixture f(/*inbound=*/false, 4096,
            [&order](const v1::TransferStatus&) { order.push_back("metrics"); });
  Record* record = f.record.get();
  REQUIRE(record
              ->WhenEnded([&order](const v1::TransferStatus& status) {
                CHECK(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
                order.push_back("waiter");
              })
              .ok());
  REQUIRE(record->TakeInitialTiles().size() == 1);
  record->OnTileStart(0);
  record->OnTileDone(0, absl::OkStatus());
  REQUIRE(record->IsFinal());
  CHECK(order == std::vector<std::string>{"waiter", "metrics"});
}

TEST_CASE("an end's listener gets what it asked for: the end alone, or the whole status") {
  v1::TransferSpec spec;
  spec.set_priority(v1::PRIORITY_CRITICAL);
  spec.set_label("decode 12");
  for (uint32_t id : {3u, 9u}) spec.mutable_src()->add_block_ids(id);
  v1::TransferStatus metrics, end, whole, late_end, late_whole;
  Fixture f(/*inbound=*/false, 4096, [&](const v1::TransferStatus& s) { metrics = s; }, spec);
  Record* record = f.record.get();
  REQUIRE(
      record->WhenEnded([&](const v1::TransferStatus& s) { end = s; }, false, StatusDetail::kEnd)
          .ok());
  REQUIRE(record->WhenEnded([&](const v1::TransferStatus& s) { whole = s; }).ok());
  REQUIRE(record->TakeInitialTiles().size() == 1);
  record->OnTileStart(0);
  f.clock.Advance(absl::Microseconds(5));
  record->OnTileDone(0, absl::OkStatus());
  REQUIRE(record->IsFinal());
  // After the end: given at once, as asked.
  REQUIRE(
      record
          ->WhenEnded([&](const v1::TransferStatus& s) { late_end = s; }, false, StatusDetail::kEnd)
          .ok());
  REQUIRE(record->WhenEnded([&](const v1::TransferStatus& s) { late_whole = s; }).ok());
  for (const v1::TransferStatus* s : {&metrics, &end, &late_end}) {
    // The end's fields, and of the spec only its priority (the metrics' and the log's label).
    CHECK(s->transfer_id() == 7);
    CHECK(s->state() == v1::TRANSFER_STATE_SUCCEEDED);
    CHECK(s->bytes_total() == 4096);
    CHECK(s->bytes_done() == 4096);
    CHECK(s->finished_unix_us() > 0);
    CHECK(s->spec().priority() == v1::PRIORITY_CRITICAL);
    CHECK(s->spec().label().empty());
    CHECK(s->spec().src().block_ids_size() == 0);
    CHECK(s->path_reason().empty());
    CHECK(s->link().empty());
  }
  for (const v1::TransferStatus* s : {&whole, &late_whole}) {
    CHECK(s->spec().label() == "decode 12");
    CHECK(s->spec().src().block_ids_size() == 2);
    CHECK(s->path_reason() == "same node");
    CHECK(s->link() == "host");
    CHECK(s->finished_unix_us() == end.finished_unix_us());
  }
}

}  // namespace
}  // namespace kvrail::transfers
