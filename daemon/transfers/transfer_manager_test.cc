// The transfer manager over a hand-driven engine and a manual clock: cancel, drain and deadlines
// against running tiles, waits measured by the clock, and a bounded history.
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/engine/fault_engine.h"
#include "daemon/transfers/manager_fixture.h"

namespace kvrail::transfers {
namespace {

using testing::ManagerFixture;

TEST_CASE("cancel while a tile runs: the tile completes, then the transfer is CANCELLED") {
  ManagerFixture f;
  const uint64_t id = f.Submit(4);
  REQUIRE(f.engine.queued() == 4);
  REQUIRE(f.engine.StartNext());
  auto cancelled = f.manager->Cancel(f.caller, id);
  REQUIRE(cancelled.ok());
  // The running tile has not reported: not final yet, and nothing of it is queued any more.
  CHECK(cancelled->state() == v1::TRANSFER_STATE_RUNNING);
  CHECK(f.engine.queued() == 0);
  CHECK(f.engine.removed() == 3);
  REQUIRE(f.engine.FinishNext());
  const v1::TransferStatus status = f.Get(id);
  CHECK(status.state() == v1::TRANSFER_STATE_CANCELLED);
  CHECK(status.error_code() == static_cast<int32_t>(absl::StatusCode::kCancelled));
  CHECK(status.tiles_done() == 1);
  CHECK(f.engine.reported() + f.engine.removed() == f.engine.enqueued());  // no tile twice
  const v1::Stats stats = f.Stats();
  CHECK(stats.transfers_submitted() == 1);
  CHECK(stats.transfers_cancelled() == 1);
  CHECK(stats.transfers_succeeded() == 0);
  CHECK(stats.transfers_active() == 0);
  CHECK(stats.bytes_moved() == testing::kTile);
  // A second cancel changes nothing.
  CHECK(f.manager->Cancel(f.caller, id)->state() == v1::TRANSFER_STATE_CANCELLED);
  CHECK(f.Stats().transfers_cancelled() == 1);
}

TEST_CASE("the last tile completing races a cancel on another thread: one consistent end") {
  ManagerFixture f;
  constexpr int kRounds = 300;
  int succeeded = 0, cancelled = 0;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t id = f.Submit(1);
    REQUIRE(f.engine.StartNext());
    std::atomic<bool> go{false};
    std::thread finisher([&] {
      while (!go.load()) {
      }
      f.engine.FinishNext();
    });
    std::thread canceller([&] {
      while (!go.load()) {
      }
      (void)f.manager->Cancel(f.caller, id);
    });
    go = true;
    finisher.join();
    canceller.join();
    const v1::TransferStatus status = f.Get(id);
    if (status.state() == v1::TRANSFER_STATE_SUCCEEDED) {
      ++succeeded;
      CHECK(status.tiles_done() == 1);
      CHECK(status.error_code() == 0);
    } else {
      REQUIRE(status.state() == v1::TRANSFER_STATE_CANCELLED);
      ++cancelled;
      CHECK(status.tiles_done() == 1);  // the running tile still landed and was counted once
    }
  }
  const v1::Stats stats = f.Stats();
  CHECK(stats.transfers_submitted() == kRounds);
  CHECK(stats.transfers_succeeded() == static_cast<uint64_t>(succeeded));
  CHECK(stats.transfers_cancelled() == static_cast<uint64_t>(cancelled));
  CHECK(stats.transfers_active() == 0);
  CHECK(f.engine.reported() == kRounds);
}

TEST_CASE("drain returns only after running tiles reported; nothing starts afterwards") {
  ManagerFixture f;
  const uint64_t id = f.Submit(4);
  REQUIRE(f.engine.StartNext());
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    f.manager->Drain(absl::ZeroDuration());  // the manual clock never moves: no grace period
    drained = true;
  });
  // Drain has refused new work and removed the queued tiles; it waits for the running one.
  while (f.engine.queued() != 0) std::this_thread::yield();
  CHECK(f.manager->Submit(f.Bound(testing::BytesSpec(f.src->id(), f.dst->id(), 1024)))
            .status()
            .code() == absl::StatusCode::kUnavailable);
  CHECK_FALSE(f.Get(id).state() >= v1::TRANSFER_STATE_SUCCEEDED);
  CHECK_FALSE(drained.load());
  REQUIRE(f.engine.FinishNext());
  drainer.join();
  const v1::TransferStatus status = f.Get(id);
  CHECK(status.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(status.error_code() == static_cast<int32_t>(absl::StatusCode::kUnavailable));
  CHECK(status.tiles_done() == 1);
  CHECK(f.engine.queued() == 0);
  CHECK(f.engine.running() == 0);
  CHECK(f.manager->MarkReady(f.caller, id, 0, 1).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(f.engine.queued() == 0);
}

TEST_CASE("the deadline passes while the last tile runs: exactly one final state") {
  SECTION("the tile lands") {
    ManagerFixture f;
    v1::TransferSpec spec;
    spec.set_timeout_ms(1000);
    const uint64_t id = f.Submit(2, spec);
    REQUIRE(f.engine.StartNext());
    REQUIRE(f.engine.FinishNext());
    REQUIRE(f.engine.StartNext());
    f.clock.Advance(absl::Seconds(2));
    f.manager->CheckDeadlines();
    CHECK(f.Get(id).state() == v1::TRANSFER_STATE_RUNNING);  // the running tile reports first
    REQUIRE(f.engine.FinishNext());
    const v1::TransferStatus status = f.Get(id);
    // Every tile landed: the transfer did what was asked.
    CHECK(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
    CHECK(status.error_code() == 0);
    f.manager->CheckDeadlines();
    const v1::Stats stats = f.Stats();
    CHECK(stats.transfers_succeeded() == 1);
    CHECK(stats.transfers_failed() == 0);
    CHECK(stats.transfers_active() == 0);
  }
  SECTION("the tile fails") {
    ManagerFixture f;
    v1::TransferSpec spec;
    spec.set_timeout_ms(1000);
    const uint64_t id = f.Submit(2, spec);
    REQUIRE(f.engine.StartNext());
    f.clock.Advance(absl::Seconds(2));
    f.manager->CheckDeadlines();
    CHECK(f.engine.removed() == 1);
    REQUIRE(f.engine.FinishNext(absl::InternalError("copy failed")));
    const v1::TransferStatus status = f.Get(id);
    CHECK(status.state() == v1::TRANSFER_STATE_FAILED);
    // The first reason to end is the one reported.
    CHECK(status.error_code() == static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
    const v1::Stats stats = f.Stats();
    CHECK(stats.transfers_failed() == 1);
    CHECK(stats.transfers_active() == 0);
  }
}

TEST_CASE("Wait measures its timeout by the injected clock") {
  ManagerFixture f;
  const uint64_t id = f.Submit(2);
  std::atomic<bool> returned{false};
  absl::StatusOr<v1::TransferStatus> waited;
  const absl::Time real_start = absl::Now();
  std::thread waiter([&] {
    waited = f.manager->Wait(f.caller, id, absl::Seconds(30));
    returned = true;
  });
  // Only the manual clock ends this wait (the real one would take 30 s). It is moved until the
  // waiter returns, however late the waiter started.
  while (!returned.load()) {
    f.clock.Advance(absl::Seconds(31));
    absl::SleepFor(absl::Milliseconds(1));
  }
  waiter.join();
  CHECK(absl::Now() - real_start < absl::Seconds(10));
  REQUIRE(waited.ok());
  CHECK(waited->state() == v1::TRANSFER_STATE_QUEUED);
  // With the clock standing still, the wait ends when the transfer does.
  std::thread finisher([&] { f.engine.RunAll(); });
  auto done = f.manager->Wait(f.caller, id, absl::Seconds(30));
  finisher.join();
  REQUIRE(done.ok());
  CHECK(done->state() == v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE("the history stays bounded while an old transfer stays open") {
  Options options;
  options.history = 5;
  ManagerFixture f(options);
  v1::TransferSpec layerwise;
  layerwise.set_layerwise(true);  // never marked ready: stays open
  const uint64_t open = f.Submit(1, layerwise);
  uint64_t first_done = 0;
  for (int i = 0; i < 50; ++i) {
    v1::TransferSpec spec;
    spec.set_idempotency_key(absl::StrCat("key-", i));
    const uint64_t id = f.Submit(1, spec);
    if (i == 0) first_done = id;
    f.engine.RunAll();
  }
  const auto all = f.manager->List(f.caller, {}, 1000);
  CHECK(all.size() <= 6);
  CHECK(all.back().transfer_id() == open);  // the open one is kept (oldest, listed last)
  CHECK(f.Get(open).state() == v1::TRANSFER_STATE_QUEUED);
  CHECK(f.manager->Get(f.caller, first_done).status().code() == absl::StatusCode::kNotFound);
  // A trimmed transfer's key is free again: the same key starts a new transfer.
  v1::TransferSpec again;
  again.set_idempotency_key("key-0");
  again.mutable_src()->set_region_id(f.src->id());
  again.mutable_dst()->set_region_id(f.dst->id());
  again.set_num_bytes(testing::kTile);
  auto response = f.manager->Submit(f.Bound(again));
  REQUIRE(response.ok());
  CHECK_FALSE(response->deduplicated());
  f.engine.RunAll();
}

TEST_CASE("an injected tile failure fails the transfer with the injected status") {
  testing::FakeEngine inner;
  const absl::Status injected = absl::DataLossError("injected: tile 1 lost");
  auto faulty = engine::FaultInjectingEngine::Create(&inner, engine::FailTiles(0, {1}, injected));
  {
    ManagerFixture f(Options(), faulty.get());
    const uint64_t id = f.Submit(3);
    CHECK(inner.queued() == 2);  // tile 1 never reaches the engine
    inner.RunAll();
    // The clock stands still: it ends by itself.
    auto status = f.manager->Wait(f.caller, id, absl::Hours(1));
    REQUIRE(status.ok());
    CHECK(status->state() == v1::TRANSFER_STATE_FAILED);
    CHECK(status->error_code() == static_cast<int32_t>(injected.code()));
    CHECK(status->error_message() == injected.message());
    CHECK(status->tiles_done() == 2);
    CHECK(faulty->failed() == 1);
  }
}

TEST_CASE("a held tile lets a cancel win: nothing of the transfer runs") {
  testing::FakeEngine inner;
  auto faulty = engine::FaultInjectingEngine::Create(
      &inner, [](const engine::TileRef&) { return engine::Fault::Hold(); });
  ManagerFixture f(Options(), faulty.get());
  const uint64_t id = f.Submit(2);
  CHECK(faulty->held() == 2);
  auto cancelled = f.manager->Cancel(f.caller, id);
  REQUIRE(cancelled.ok());
  CHECK(cancelled->state() == v1::TRANSFER_STATE_CANCELLED);
  CHECK(cancelled->tiles_done() == 0);
  faulty->ReleaseHeld();
  CHECK(inner.enqueued() == 0);
}

TEST_CASE("an admission hands its tiles over as admitted; a transfer ended there is whole") {
  ManagerFixture f;
  // Initial tiles go through EnqueueAdmitted (an engine may run them on the admitting thread).
  const uint64_t queued = f.Submit(2);
  CHECK(f.engine.admitted() == 2);
  CHECK(f.engine.queued() == 2);
  f.engine.RunAll();
  CHECK(f.Get(queued).state() == v1::TRANSFER_STATE_SUCCEEDED);
  // Run there to the end: Submit answers a transfer that has already succeeded, counted once.
  f.engine.set_run_admitted(true);
  const uint64_t ran = f.Submit(1);
  CHECK(f.engine.admitted() == 3);
  CHECK(f.engine.queued() == 0);
  const v1::TransferStatus status = f.Get(ran);
  CHECK(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(status.tiles_done() == 1);
  // Its waiters registered after the end are answered at once.
  std::atomic<int> ended{0};
  REQUIRE(f.manager
              ->WhenEnded(f.caller, ran,
                          [&](const v1::TransferStatus& s) {
                            if (s.state() == v1::TRANSFER_STATE_SUCCEEDED) ++ended;
                          })
              .ok());
  CHECK(ended.load() == 1);
  const v1::Stats stats = f.Stats();
  CHECK(stats.transfers_submitted() == 2);
  CHECK(stats.transfers_succeeded() == 2);
  CHECK(stats.transfers_active() == 0);
  // Tiles a layer-wise transfer releases later (MarkReady) are no admission's: plain Enqueue.
  v1::TransferSpec layerwise;
  layerwise.set_layerwise(true);
  const uint64_t id = f.Submit(1, layerwise);
  CHECK(f.engine.admitted() == 3);
  REQUIRE(f.manager->MarkReady(f.caller, id, 0, 1).ok());
  CHECK(f.engine.admitted() == 3);
  CHECK(f.engine.queued() == 1);
  f.engine.RunAll();
  CHECK(f.Get(id).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace kvrail::transfers
