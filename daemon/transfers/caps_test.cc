// No client can starve the rest (docs/security.md "Caps"), at the manager: transfers in
// flight per session, the ListTransfers page size, a session's end failing the transfers waiting
// for its readiness, a lost peer failing the transfers sent to it at once, watches that end when
// their watcher goes, and a history that stays bounded behind a stuck transfer. Each test tries to
// get past the check.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/transfers/manager_fixture.h"

namespace kvrail::transfers {
namespace {

using testing::kTile;
using testing::ManagerFixture;

bool Names(const absl::Status& status, absl::StatusCode code, const std::string& text) {
  INFO(status.ToString());
  return status.code() == code && std::string(status.message()).find(text) != std::string::npos;
}

v1::TransferSpec Of(uint64_t session, bool layerwise = false) {
  v1::TransferSpec spec;
  spec.set_session_id(session);
  spec.set_layerwise(layerwise);
  return spec;
}

TEST_CASE("a session beyond max_transfers_per_session in flight is refused, naming the cap") {
  Options options;
  options.max_transfers_per_session = 3;
  ManagerFixture f(options);
  const uint64_t greedy = f.regions.NewSession(), other = f.regions.NewSession();
  for (int i = 0; i < 3; ++i) f.Submit(1, Of(greedy));
  v1::TransferSpec fourth = Of(greedy);
  fourth.mutable_src()->set_region_id(f.src->id());
  fourth.mutable_dst()->set_region_id(f.dst->id());
  fourth.mutable_src()->set_grant(f.src_grant);  // the fixture's owner's, made by f.Submit
  fourth.mutable_dst()->set_grant(f.dst_grant);
  fourth.set_num_bytes(kTile);
  CHECK(Names(f.manager->Submit(f.Bound(fourth)).status(), absl::StatusCode::kResourceExhausted,
              "max_transfers_per_session"));
  // Refused submits (bad requests) do not use up places either.
  v1::TransferSpec bad = fourth;
  bad.set_session_id(other);
  bad.set_num_bytes(1ull << 40);
  for (int i = 0; i < 10; ++i) CHECK_FALSE(f.manager->Submit(f.Bound(bad)).ok());
  // Another session is not starved.
  for (int i = 0; i < 3; ++i) f.Submit(1, Of(other));
  // Ended transfers give their places back.
  f.engine.RunAll();
  CHECK(f.manager->Submit(f.Bound(fourth)).ok());
  f.engine.RunAll();
}

TEST_CASE("a ListTransfers page above max_list_transfers is refused; a tenant's page is its own") {
  Options options;
  options.max_list_transfers = 10;
  ManagerFixture f(options);
  const uint64_t a = f.regions.NewSession(), b = f.regions.NewSession();
  for (int i = 0; i < 8; ++i) f.Submit(1, Of(a));
  for (int i = 0; i < 8; ++i) f.Submit(1, Of(b));
  f.engine.RunAll();
  ListFilter filter;
  filter.limit = 11;
  CHECK(Names(f.manager->ListChecked(f.As(a), filter).status(),
              absl::StatusCode::kResourceExhausted, "limit"));
  filter.limit = 10;
  filter.session_id = a;
  auto page = f.manager->ListChecked(f.As(a), filter);
  REQUIRE(page.ok());
  // All eight of a's, though b's eight are newer: the limit counts the session's own.
  CHECK(page->size() == 8);
  for (const auto& s : *page) CHECK(s.spec().session_id() == a);
}

TEST_CASE("a session's end fails at once the transfers waiting for its readiness, only those") {
  ManagerFixture f;
  f.regions.sessions()->AddSessionEndHook([m = f.manager.get()](uint64_t s) { m->EndSession(s); });
  const uint64_t producer = f.regions.NewSession(), other = f.regions.NewSession();
  const uint64_t waiting = f.Submit(4, Of(producer, true));  // layer-wise, nothing ready
  const uint64_t all_ready = f.Submit(1, Of(producer, true));
  REQUIRE(f.manager->MarkReady(f.As(producer), all_ready, 0, 1).ok());
  const uint64_t bulk = f.Submit(2, Of(producer));
  const uint64_t others = f.Submit(1, Of(other, true));

  f.regions.sessions()->EndSession(producer);        // the producer died
  const v1::TransferStatus failed = f.Get(waiting);  // no clock advance, no deadline: at once
  CHECK(failed.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(failed.error_code() == static_cast<int32_t>(absl::StatusCode::kAborted));
  CHECK(failed.error_message().find("session") != std::string::npos);
  f.engine.RunAll();
  CHECK(f.Get(all_ready).state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(f.Get(bulk).state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(f.Get(others).state() == v1::TRANSFER_STATE_QUEUED);
  REQUIRE(f.manager->Cancel(f.As(other), others).ok());
}

TEST_CASE("a session's end fails at once every transfer on its regions; no tile moves after") {
  // A decode's pull (it owns the destination) and a push into the decode (another session
  // submits): its process dies with both queued and the first one layer-wise, waiting for the
  // prefill's MarkReady. Neither may write into its pool afterwards.
  ManagerFixture f;
  f.regions.sessions()->AddSessionEndHook([m = f.manager.get()](uint64_t s) { m->EndSession(s); });
  const uint64_t decode = f.regions.NewSession(), prefill = f.regions.NewSession();
  const std::shared_ptr<regions::Region> pool = f.regions.Bytes(64 * kTile, true, decode);
  // Writable so the test can fill it through the daemon's mapping; read as a source.
  const std::shared_ptr<regions::Region> source = f.regions.Bytes(64 * kTile, true, prefill);
  std::memset(source->data(), 0x5A, 64 * kTile);
  // Each side's owner lets the other's transfer use its region: the prefill's read grant of
  // its source for the pull, the decode's write grant of its pool for the push.
  const std::string read_grant = f.Grant(*source, v1::GRANT_ACCESS_READ);
  const std::string write_grant = f.Grant(*pool, v1::GRANT_ACCESS_WRITE);
  auto submit = [&](uint64_t session, bool layerwise) {
    v1::TransferSpec spec = Of(session, layerwise);
    spec.mutable_src()->set_region_id(source->id());
    spec.mutable_dst()->set_region_id(pool->id());
    if (session != prefill) spec.mutable_src()->set_grant(read_grant);
    if (session != decode) spec.mutable_dst()->set_grant(write_grant);
    spec.set_num_bytes(4 * kTile);
    auto response = f.manager->Submit(f.Bound(spec));
    REQUIRE(response.ok());
    return response->transfer_id();
  };
  const uint64_t pull = submit(decode, true);
  const uint64_t push = submit(prefill, false);
  const uint64_t unrelated = f.Submit(1, Of(prefill));  // fixture regions: not the decode's
  REQUIRE(f.engine.queued() > 0);

  f.regions.sessions()->EndSession(decode);  // the decode process died
  for (uint64_t id : {pull, push}) {
    const v1::TransferStatus ended = f.Get(id);  // no engine step, no clock advance: at once
    CHECK(ended.state() == v1::TRANSFER_STATE_FAILED);
    CHECK(ended.error_code() == static_cast<int32_t>(absl::StatusCode::kAborted));
    CHECK(ended.error_message().find("destination region (session " + std::to_string(decode) +
                                     ") ended") != std::string::npos);
  }
  const size_t queued = f.engine.queued();
  CHECK(f.manager->MarkReady(f.As(decode), pull, 0, 1).ok());  // ended: nothing is enqueued
  CHECK(f.engine.queued() == queued);
  f.engine.RunAll();
  CHECK(f.Get(pull).state() == v1::TRANSFER_STATE_FAILED);
  CHECK(f.Get(push).state() == v1::TRANSFER_STATE_FAILED);
  CHECK(f.Get(unrelated).state() == v1::TRANSFER_STATE_SUCCEEDED);
  for (uint64_t i = 0; i < 64 * kTile; ++i) {
    if (pool->data()[i] != 0) FAIL("byte " << i << " of the dead session's pool was written");
  }

  // The source's owner dying ends a transfer still waiting for layers of it (nobody vouches for
  // them); one whose bytes were all ready finishes: a bulk push of its own (another session's
  // read by its grant ends with the grant: grant_end_test).
  const uint64_t reader = f.regions.NewSession();
  const std::shared_ptr<regions::Region> into = f.regions.Bytes(64 * kTile, true, reader);
  const std::string into_grant = f.Grant(*into, v1::GRANT_ACCESS_WRITE);
  auto read = [&](uint64_t submitter, bool layerwise) {
    v1::TransferSpec spec = Of(submitter, layerwise);
    spec.mutable_src()->set_region_id(source->id());
    spec.mutable_dst()->set_region_id(into->id());
    if (submitter != prefill) spec.mutable_src()->set_grant(read_grant);
    if (submitter != reader) spec.mutable_dst()->set_grant(into_grant);
    spec.set_num_bytes(4 * kTile);
    auto reading = f.manager->Submit(f.Bound(spec));
    INFO(reading.status().ToString());
    REQUIRE(reading.ok());
    return reading->transfer_id();
  };
  const uint64_t waiting = read(reader, true), ready = read(prefill, false);
  f.regions.sessions()->EndSession(prefill);
  const v1::TransferStatus gone = f.Get(waiting);
  CHECK(gone.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(gone.error_message().find("source region") != std::string::npos);
  f.engine.RunAll();
  CHECK(f.Get(ready).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

// A RemotePath to node "peer" whose tiles go to a fake engine. Thread-safe.
class FakeRemote final : public RemotePath {
 public:
  FakeRemote(std::shared_ptr<regions::Region> like, engine::Engine* engine)
      : like_(std::move(like)), engine_(engine) {}
  absl::StatusOr<Prepared> Prepare(const v1::TransferSpec&) override {
    return Prepared{std::make_shared<testing::StandInRegion>(like_), engine_, 1 << 20};
  }
  absl::StatusOr<std::vector<std::string>> Begin(uint64_t, const v1::TransferSpec&,
                                                 const regions::Region&, uint64_t,
                                                 const std::shared_ptr<engine::Job>&) override {
    return std::vector<std::string>{"nic0"};
  }

 private:
  const std::shared_ptr<regions::Region> like_;
  engine::Engine* const engine_;
};

TEST_CASE("a lost peer fails a layer-wise transfer to it at once, not at its deadline") {
  testing::FakeEngine fabric_engine;
  testing::TestRegions lease_like;
  FakeRemote remote(lease_like.Bytes(64 * kTile, true), &fabric_engine);
  Options options;
  options.remote = &remote;
  ManagerFixture f(options);
  v1::TransferSpec spec = Of(f.regions.session(), true);
  spec.mutable_dst()->set_node_id("peer");
  spec.set_timeout_ms(3600 * 1000);
  const uint64_t to_peer = f.Submit(2, spec);
  v1::TransferSpec elsewhere = spec;
  elsewhere.mutable_dst()->set_node_id("another-peer");
  const uint64_t to_other = f.Submit(2, elsewhere);
  // Waiting for its producer: nothing of it is in the fabric for the fabric to fail.
  CHECK(fabric_engine.queued() == 0);
  REQUIRE(f.Get(to_peer).state() == v1::TRANSFER_STATE_QUEUED);

  f.manager->PeerLost("peer", absl::UnavailableError("peer 'peer' is down: no answer for 3s"));
  const v1::TransferStatus lost = f.Get(to_peer);
  CHECK(lost.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(lost.error_message().find("is down") != std::string::npos);
  CHECK(f.Get(to_other).state() != v1::TRANSFER_STATE_FAILED);
  REQUIRE(f.manager->Cancel(f.caller, to_other).ok());
  fabric_engine.RunAll();
}

TEST_CASE("a watch of a transfer that makes no progress ends when its watcher goes") {
  ManagerFixture f;
  const uint64_t stuck = f.Submit(1, Of(f.regions.session(), true));  // never made ready
  std::atomic<bool> gone{false};
  auto watch = std::async(std::launch::async, [&] {
    return f.manager->Watch(
        f.caller, stuck, absl::Milliseconds(1), [](const v1::TransferEvent&) { return true; },
        [&] { return !gone.load(); });
  });
  CHECK(watch.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  gone.store(true);  // the client went away; no event will ever be sent
  REQUIRE(watch.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  CHECK(watch.get().ok());
  REQUIRE(f.manager->Cancel(f.caller, stuck).ok());
}

TEST_CASE("the history stays bounded behind one stuck transfer over thousands of transfers") {
  Options options;
  options.history = 100;
  ManagerFixture f(options);
  const uint64_t stuck = f.Submit(1, Of(f.regions.session(), true));
  for (int i = 0; i < 5000; ++i) {
    f.Submit(1, Of(f.regions.session()));
    f.engine.RunAll();
  }
  ListFilter all;
  all.limit = 100000;
  const auto listed = f.manager->List(f.caller, all);
  CHECK(listed.size() == 100);  // the limit, the open one among them
  CHECK(listed.back().transfer_id() == stuck);
  REQUIRE(f.manager->Cancel(f.caller, stuck).ok());
}

}  // namespace
}  // namespace kvrail::transfers
