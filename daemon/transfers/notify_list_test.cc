// Notifications through the transfer manager (who receives a transfer's TransferSpec.notification
// when it ends, and who does not) and List's filters (region, label, idempotency key).
#include <catch2/catch.hpp>
#include <string>

#include "daemon/engine/fault_engine.h"
#include "daemon/transfers/manager_fixture.h"

namespace kvrail::transfers {
namespace {

using testing::kTile;
using testing::ManagerFixture;

// A prefill session owning the source and a decode session owning the destination; the decode
// side submits (it pulls the prefill's blocks). Each owner grants the other side's use.
struct TwoOwners {
  ManagerFixture f;
  uint64_t prefill = f.regions.NewSession();
  uint64_t decode = f.regions.NewSession();
  std::shared_ptr<regions::Region> src = f.regions.Bytes(8 * kTile, false, prefill);
  std::shared_ptr<regions::Region> dst = f.regions.Bytes(8 * kTile, true, decode);
  std::string read = f.Grant(*src, v1::GRANT_ACCESS_READ);
  std::string write = f.Grant(*dst, v1::GRANT_ACCESS_WRITE);

  // `submitter` 0: the fixture's own session (f.Bound), a third party to both regions.
  v1::TransferSpec Spec(uint32_t tiles, const std::string& note, uint64_t submitter) {
    v1::TransferSpec spec;
    spec.mutable_src()->set_region_id(src->id());
    spec.mutable_dst()->set_region_id(dst->id());
    if (submitter != prefill) spec.mutable_src()->set_grant(read);
    if (submitter != decode) spec.mutable_dst()->set_grant(write);
    spec.set_num_bytes(uint64_t{tiles} * kTile);
    spec.set_notification(note);
    spec.set_session_id(submitter);
    return spec;
  }
  std::vector<v1::Notification> Take(uint64_t session) {
    auto taken = f.hub->Take(session, 0, absl::ZeroDuration());
    REQUIRE(taken.ok());
    return *taken;
  }
};

TEST_CASE("the owner of the other region is notified when the transfer succeeds") {
  TwoOwners t;
  auto accepted = t.f.manager->Submit(t.f.Bound(t.Spec(2, "request-17", t.decode)));
  REQUIRE(accepted.ok());
  CHECK(t.Take(t.prefill).empty());  // nothing before the end
  t.f.engine.RunAll();
  const std::vector<v1::Notification> got = t.Take(t.prefill);
  REQUIRE(got.size() == 1);
  CHECK(got[0].notification() == "request-17");
  CHECK(got[0].transfer_id() == accepted->transfer_id());
  CHECK(got[0].submitter_transfer_id() == accepted->transfer_id());
  CHECK(got[0].submitter_node_id() == "here");
  CHECK(got[0].region_id() == t.src->id());
  CHECK(got[0].region_is_source());
  CHECK(got[0].state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(got[0].error_code() == 0);
  // The submitter is not told about its own transfer, and a notification is taken once.
  CHECK(t.Take(t.decode).empty());
  CHECK(t.Take(t.prefill).empty());
}

TEST_CASE("a failed or cancelled transfer notifies with its final state and error") {
  testing::FakeEngine inner;
  const absl::Status injected = absl::DataLossError("injected: tile 0 lost");
  auto faulty = engine::FaultInjectingEngine::Create(&inner, engine::FailTiles(0, {0}, injected));
  ManagerFixture f(Options(), faulty.get());
  const uint64_t prefill = f.regions.NewSession(), decode = f.regions.NewSession();
  auto src = f.regions.Bytes(8 * kTile, false, prefill);
  auto dst = f.regions.Bytes(8 * kTile, true, decode);
  v1::TransferSpec spec;
  spec.mutable_src()->set_region_id(src->id());
  spec.mutable_dst()->set_region_id(dst->id());
  // Each owner's grant for the other side (an owner's own region needs none; passing it is fine).
  spec.mutable_src()->set_grant(f.Grant(*src, v1::GRANT_ACCESS_READ));
  spec.mutable_dst()->set_grant(f.Grant(*dst, v1::GRANT_ACCESS_WRITE));
  spec.set_num_bytes(2 * kTile);
  spec.set_notification("failing");
  spec.set_session_id(decode);
  auto first = f.manager->Submit(f.Bound(spec));
  REQUIRE(first.ok());
  inner.RunAll();
  // The injected failure reports from the decorator's own thread: wait for the end.
  REQUIRE(f.manager->Wait(f.As(decode), first->transfer_id(), absl::Hours(1))->state() ==
          v1::TRANSFER_STATE_FAILED);
  auto failed = f.hub->Take(prefill, 0, absl::ZeroDuration());
  REQUIRE(failed.ok());
  REQUIRE(failed->size() == 1);
  CHECK((*failed)[0].state() == v1::TRANSFER_STATE_FAILED);
  CHECK((*failed)[0].error_code() == static_cast<int32_t>(injected.code()));
  CHECK((*failed)[0].error_message() == injected.message());

  // The prefill side submits this time (a push): the decode side hears of the cancel.
  spec.set_notification("cancelled");
  spec.set_session_id(prefill);
  auto accepted = f.manager->Submit(f.Bound(spec));
  REQUIRE(accepted.ok());
  REQUIRE(f.manager->Cancel(f.As(prefill), accepted->transfer_id()).ok());
  inner.RunAll();
  auto cancelled = f.hub->Take(decode, 0, absl::ZeroDuration());
  REQUIRE(cancelled.ok());
  REQUIRE(cancelled->size() == 1);
  CHECK((*cancelled)[0].notification() == "cancelled");
  CHECK((*cancelled)[0].state() == v1::TRANSFER_STATE_CANCELLED);
  CHECK_FALSE((*cancelled)[0].region_is_source());
  CHECK((*cancelled)[0].region_id() == dst->id());
  CHECK(f.hub->Queued(prefill) == 0);
}

TEST_CASE("a third party's transfer notifies both owners; one owner of both, once") {
  TwoOwners t;
  REQUIRE(t.f.manager->Submit(t.f.Bound(t.Spec(1, "both", 0))).ok());
  t.f.engine.RunAll();
  CHECK(t.Take(t.prefill).size() == 1);
  CHECK(t.Take(t.decode).size() == 1);

  // The fixture's own regions share one session: a third party's transfer tells it once.
  v1::TransferSpec spec;
  spec.set_notification("once");
  spec.set_session_id(t.prefill);
  t.f.Submit(1, spec);
  t.f.engine.RunAll();
  const auto got = t.Take(t.f.regions.session());
  REQUIRE(got.size() == 1);
  CHECK(got[0].region_id() == t.f.dst->id());  // the destination wins
}

TEST_CASE("a notification for a session that ended is dropped, not queued") {
  TwoOwners t;
  REQUIRE(t.f.manager->Submit(t.f.Bound(t.Spec(1, "late", t.decode))).ok());
  // The prefill process exits before the transfer ends: its region stays alive for the transfer,
  // its notification goes nowhere, and no queue is left behind.
  t.f.regions.sessions()->EndSession(t.prefill);
  t.f.engine.RunAll();
  CHECK(t.f.hub->Queued(t.prefill) == 0);
  CHECK(t.f.hub->Take(t.prefill, 0, absl::ZeroDuration()).status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("a notification above 1024 bytes is refused, naming the field") {
  TwoOwners t;
  auto refused = t.f.manager->Submit(t.f.Bound(t.Spec(1, std::string(1025, 'x'), t.decode)));
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.status().message().find("spec.notification") != std::string::npos);
  CHECK(t.f.manager->Submit(t.f.Bound(t.Spec(1, std::string(1024, 'x'), t.decode))).ok());
  t.f.engine.RunAll();
}

TEST_CASE("List filters by region, label and idempotency key") {
  TwoOwners t;
  v1::TransferSpec labelled = t.Spec(1, "", 0);
  labelled.set_label("req-a");
  labelled.set_idempotency_key("key-a");
  const uint64_t a = t.f.manager->Submit(t.f.Bound(labelled))->transfer_id();
  const uint64_t b = t.f.Submit(1);  // the fixture's own regions, no label
  t.f.engine.RunAll();

  auto ids = [&](const ListFilter& filter) {
    std::vector<uint64_t> out;
    for (const auto& s : t.f.manager->List(t.f.caller, filter)) out.push_back(s.transfer_id());
    return out;
  };
  ListFilter by_src;
  by_src.region_id = t.src->id();
  CHECK(ids(by_src) == std::vector<uint64_t>{a});
  ListFilter by_dst;
  by_dst.region_id = t.f.dst->id();
  CHECK(ids(by_dst) == std::vector<uint64_t>{b});
  ListFilter by_label;
  by_label.label = "req-a";
  CHECK(ids(by_label) == std::vector<uint64_t>{a});
  ListFilter by_key;
  by_key.idempotency_key = "key-a";
  CHECK(ids(by_key) == std::vector<uint64_t>{a});
  ListFilter none_match;
  none_match.label = "req-a";
  none_match.region_id = t.f.dst->id();
  CHECK(ids(none_match).empty());
  ListFilter states;
  states.states = {v1::TRANSFER_STATE_FAILED};
  CHECK(ids(states).empty());
  CHECK(ids(ListFilter()) == std::vector<uint64_t>{b, a});  // newest first
}

}  // namespace
}  // namespace kvrail::transfers
