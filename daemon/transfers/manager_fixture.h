// A TransferManager over a FakeEngine, a ManualClock and memfd host regions, for this package's
// tests.
#pragma once

#include <catch2/catch.hpp>

#include <memory>

#include "base/manual_clock.h"
#include "daemon/transfers/fake_engine.h"
#include "daemon/transfers/test_support.h"
#include "daemon/transfers/transfers.h"

namespace kvrail::transfers::testing {

inline constexpr uint64_t kTile = 1024;

// Thread-compatible; the manager and engine inside are thread-safe. The destructor drains the
// manager, so every tile a test started must have been finished by then.
struct ManagerFixture {
  ManualClock clock;
  TestRegions regions{&clock};  // grants expire by this clock
  FakeEngine engine;
  std::shared_ptr<regions::Region> src = regions.Bytes(64 * kTile, false);
  std::shared_ptr<regions::Region> dst = regions.Bytes(64 * kTile, true);
  // Notification queues of the table's sessions (wired as the daemon wires them), used unless
  // the options name another hub.
  std::unique_ptr<NotificationHub> hub = NotificationHub::Create(
      [table = regions.sessions()](uint64_t session) { return table->SessionOpen(session); });
  std::unique_ptr<TransferManager> manager;

  // Access control (Options::check_access) is off unless `check_access`: most tests here are
  // about other behaviour; access_test.cc checks it.
  explicit ManagerFixture(Options options = Options(), engine::Engine* use = nullptr,
                          bool check_access = false) {
    options.check_access = check_access;
    options.node_id = "here";
    options.tile_bytes = kTile;
    if (options.notifications == nullptr) options.notifications = hub.get();
    regions.sessions()->AddSessionEndHook([h = hub.get()](uint64_t s) { h->EndSession(s); });
    manager = TransferManager::Create(regions.table(), regions.grants(),
                                      EngineRegistry({use != nullptr ? use : &engine}), &clock,
                                      options);
  }
  ~ManagerFixture() {
    manager->Drain(absl::ZeroDuration());
    engine.RunAll();  // nothing should be left; if something is, it reports before teardown
  }
  // A bulk transfer of `tiles` tiles; REQUIREs it is accepted.
  uint64_t Submit(uint32_t tiles, v1::TransferSpec spec = v1::TransferSpec()) {
    spec.mutable_src()->set_region_id(src->id());
    spec.mutable_dst()->set_region_id(dst->id());
    spec.set_num_bytes(uint64_t{tiles} * kTile);
    auto response = manager->Submit(spec);
    INFO(response.status().ToString());
    REQUIRE(response.ok());
    return response->transfer_id();
  }
  v1::TransferStatus Get(uint64_t id) {
    auto status = manager->Get(id);
    REQUIRE(status.ok());
    return *status;
  }
  v1::Stats Stats() {
    v1::Stats stats;
    manager->FillStats(&stats);
    return stats;
  }
};

}  // namespace kvrail::transfers::testing
