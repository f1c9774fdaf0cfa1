// Inbound fabric transfers (InboundSink): ended by the fabric or by a drain while tiles still
// land; late tiles are ignored, counts never overshoot, drain terminates.
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "daemon/transfers/manager_fixture.h"

namespace kvrail::transfers {
namespace {

using testing::ManagerFixture;

planner::Plan InboundPlan(const ManagerFixture& f, uint32_t tiles) {
  v1::TransferSpec spec = testing::BytesSpec(f.src->id(), f.dst->id(), tiles * testing::kTile);
  planner::PlanOptions options;
  options.tile_bytes = testing::kTile;
  auto plan = planner::MakePlan(spec, f.src->view(), f.dst->view(), options);
  REQUIRE(plan.ok());
  return *std::move(plan);
}

InboundSink::Admitted Begin(ManagerFixture& f, uint32_t tiles) {
  v1::TransferSpec spec = testing::BytesSpec(f.src->id(), f.dst->id(), tiles * testing::kTile);
  spec.set_idempotency_key("the sender's");
  auto admitted =
      f.manager->BeginInbound(spec, InboundPlan(f, tiles),
                              std::make_shared<testing::StandInRegion>(f.src), f.dst, "peer", 77);
  REQUIRE(admitted.ok());
  return *std::move(admitted);
}

void Land(const InboundSink::Admitted& in, uint32_t tile) {
  in.job->OnTileStart(tile);
  in.job->OnTileDone(tile, absl::OkStatus());
}

TEST_CASE("an inbound transfer succeeds when every tile has landed") {
  ManagerFixture f;
  const InboundSink::Admitted in = Begin(f, 3);
  for (uint32_t t = 0; t < 3; ++t) Land(in, t);
  const v1::TransferStatus status = f.Get(in.id);
  CHECK(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(status.path() == v1::PATH_FABRIC);
  // The sender's daemon names the link the same: sender -> receiver.
  CHECK(status.link() == "fabric:peer->here");
  CHECK(status.spec().idempotency_key().empty());
  CHECK(in.job->Ended());
  // Only root from a region-less session may cancel a transfer another node writes into this one.
  const sessions::Caller root_cli{f.regions.NewSession(), 0};
  CHECK(f.manager->Cancel(f.caller, in.id).status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(f.manager->Cancel(root_cli, in.id).ok());  // ended: a cancel is a no-op
}

TEST_CASE("EndInbound, then late tiles: ignored, no overshoot, no hang") {
  ManagerFixture f;
  const InboundSink::Admitted in = Begin(f, 4);
  Land(in, 0);
  const sessions::Caller root_cli{f.regions.NewSession(), 0};
  CHECK(f.manager->Cancel(root_cli, in.id).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK_FALSE(in.job->Ended());
  f.manager->EndInbound(in.id, absl::UnavailableError("aborted by the sender"));
  CHECK(in.job->Ended());  // the fabric's check: later tiles are dropped, not reported
  for (uint32_t t = 1; t < 4; ++t) Land(in, t);  // reported anyway
  const v1::TransferStatus status = f.Get(in.id);
  CHECK(status.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(status.tiles_done() == 1);
  CHECK(status.bytes_done() == testing::kTile);
  const v1::Stats stats = f.Stats();
  CHECK(stats.transfers_failed() == 1);
  CHECK(stats.transfers_succeeded() == 0);
  CHECK(stats.transfers_active() == 0);
  f.manager->EndInbound(in.id, absl::DataLossError("again"));  // a no-op
  CHECK(f.Get(in.id).error_code() == static_cast<int32_t>(absl::StatusCode::kUnavailable));
}

TEST_CASE("an inbound transfer's status shows no grant token to the destination's owner") {
  // The sender names the destination owner's WRITE grant in spec.dst.grant; the receiving
  // record keeps no token, so neither the owner (who reads inbound transfers) nor the operator
  // reads it back from a status.
  ManagerFixture f;
  const uint64_t owner = f.regions.NewSession();
  std::shared_ptr<regions::Region> dst = f.regions.Bytes(64 * testing::kTile, true, owner);
  v1::CreateGrantRequest request;
  request.set_region_id(dst->id());
  request.set_access(v1::GRANT_ACCESS_WRITE);
  sessions::Caller caller;
  caller.session_id = owner;
  auto grant = f.regions.grants()->CreateGrant(request, caller);
  REQUIRE(grant.ok());
  v1::TransferSpec spec = testing::BytesSpec(f.src->id(), dst->id(), testing::kTile);
  spec.mutable_dst()->set_grant(grant->token());
  auto admitted = f.manager->BeginInbound(
      spec, InboundPlan(f, 1), std::make_shared<testing::StandInRegion>(f.src), dst, "peer", 78);
  REQUIRE(admitted.ok());
  CHECK(f.Get(admitted->id).spec().dst().grant().empty());
  Land(*admitted, 0);
  const v1::TransferStatus status = f.Get(admitted->id);
  CHECK(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(status.DebugString().find(grant->token()) == std::string::npos);
  CHECK(status.DebugString().find("kvg1.") == std::string::npos);
}

TEST_CASE("drain ends an open inbound transfer at once; tiles landing meanwhile count once") {
  ManagerFixture f;
  const InboundSink::Admitted in = Begin(f, 64);
  Land(in, 0);
  std::atomic<bool> stop{false};
  std::atomic<uint32_t> landed{1};
  // The fabric keeps landing tiles while the drain runs (until it sees the record ended); the
  // last tile comes only after the drain, so the transfer cannot have succeeded meanwhile.
  std::thread fabric([&] {
    for (uint32_t t = 1; t < 63 && !stop.load(); ++t) {
      if (in.job->Ended()) break;
      Land(in, t);
      ++landed;
    }
  });
  f.manager->Drain(absl::ZeroDuration());  // returns: the record has ended
  CHECK(in.job->Ended());
  stop = true;
  fabric.join();
  for (uint32_t t = landed.load(); t < 64; ++t) Land(in, t);  // late tiles after the drain
  const v1::TransferStatus status = f.Get(in.id);
  CHECK(status.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(status.error_code() == static_cast<int32_t>(absl::StatusCode::kUnavailable));
  CHECK(status.tiles_done() <= landed.load());
  CHECK(status.tiles_done() < 64);
  CHECK(f.Stats().transfers_active() == 0);
  CHECK(f.manager
            ->BeginInbound(testing::BytesSpec(f.src->id(), f.dst->id(), testing::kTile),
                           InboundPlan(f, 1), f.src, f.dst, "peer", 78)
            .status()
            .code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvrail::transfers
