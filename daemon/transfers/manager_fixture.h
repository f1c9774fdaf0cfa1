// A TransferManager over a FakeEngine, a ManualClock and memfd host regions, for this package's
// tests.
#pragma once

#include <unistd.h>

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
  std::string src_grant, dst_grant;  // Submit's, for other sessions (made on first use)

  // The tenant the fixture's own transfers belong to: the session owning src and dst, which
  // submits (Bound), reads and controls them. Access is checked as in kvraild: a test of another
  // rule says whose call it makes (As).
  sessions::Caller caller;
  // The operator (kvraild's own uid, no session): reads every transfer's status, controls none.
  sessions::Caller reader;

  explicit ManagerFixture(Options options = Options(), engine::Engine* use = nullptr) {
    caller = regions.sessions()->CallerOf(regions.session());
    reader.uid = static_cast<int64_t>(::geteuid());
    options.node_id = "here";
    options.tile_bytes = kTile;
    if (options.notifications == nullptr) options.notifications = hub.get();
    regions.sessions()->AddSessionEndHook([h = hub.get()](uint64_t s) { h->EndSession(s); });
    manager =
        TransferManager::Create(regions.table(), regions.grants(),
                                EngineRegistry({use != nullptr ? use : &engine}), &clock, options);
  }
  ~ManagerFixture() {
    manager->Drain(absl::ZeroDuration());
    engine.RunAll();  // nothing should be left; if something is, it reports before teardown
  }
  // A bulk transfer of `tiles` tiles from src to dst; REQUIREs it is accepted. A spec naming
  // another session is that session's transfer on the fixture's regions, by the owner's grants.
  uint64_t Submit(uint32_t tiles, v1::TransferSpec spec = v1::TransferSpec()) {
    spec.mutable_src()->set_region_id(src->id());
    spec.mutable_dst()->set_region_id(dst->id());
    if (spec.session_id() != 0 && spec.session_id() != caller.session_id) {
      if (src_grant.empty()) src_grant = Grant(*src, v1::GRANT_ACCESS_READ);
      if (dst_grant.empty()) dst_grant = Grant(*dst, v1::GRANT_ACCESS_WRITE);
      spec.mutable_src()->set_grant(src_grant);
      spec.mutable_dst()->set_grant(dst_grant);
    }
    spec.set_num_bytes(uint64_t{tiles} * kTile);
    auto response = manager->Submit(Bound(std::move(spec)));
    INFO(response.status().ToString());
    REQUIRE(response.ok());
    return response->transfer_id();
  }
  // `spec` as its tenant submits it: spec.session_id is the fixture's session unless the test
  // named another (the front doors set it from the caller's credentials).
  v1::TransferSpec Bound(v1::TransferSpec spec) const {
    if (spec.session_id() == 0) spec.set_session_id(caller.session_id);
    return spec;
  }
  // The caller session `session` is (its uid as the session table knows it).
  sessions::Caller As(uint64_t session) const { return regions.sessions()->CallerOf(session); }
  // The transfer's status as the operator reads it.
  v1::TransferStatus Get(uint64_t id) {
    auto status = manager->Get(reader, id);
    REQUIRE(status.ok());
    return *status;
  }
  // A grant of `region` by its owner, live for a day (the longest: tests move the clock).
  std::string Grant(const regions::Region& region, v1::GrantAccess access) {
    v1::CreateGrantRequest request;
    request.set_region_id(region.id());
    request.set_access(access);
    request.set_ttl_ms(86400000);
    auto grant = regions.grants()->CreateGrant(request, As(region.session_id()));
    INFO(grant.status().ToString());
    REQUIRE(grant.ok());
    return grant->token();
  }
  v1::Stats Stats() {
    v1::Stats stats;
    manager->FillStats(&stats);
    return stats;
  }
};

}  // namespace kvrail::transfers::testing
