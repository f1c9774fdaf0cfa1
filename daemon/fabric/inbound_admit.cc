#include "daemon/fabric/inbound_admit.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "daemon/fabric/imm_data.h"
#include "daemon/fabric/tile_copy.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

LayerRange DestinationLayers(const planner::RegionView& dst, const v1::TransferSpec& spec) {
  LayerRange range;
  if (!dst.paged) return range;
  const uint32_t total = dst.layout.num_layers;
  range.begin = spec.dst().layer_begin();
  const uint64_t count = spec.num_layers() != 0 ? spec.num_layers()
                         : range.begin < total  ? total - range.begin
                                                : 1;
  range.end = static_cast<uint32_t>(std::min<uint64_t>(range.begin + count, UINT32_MAX));
  return range;
}

absl::StatusOr<std::shared_ptr<regions::Region>> AdmitDestination(
    const peer_v1::BeginRemoteTransferRequest& request, const Leases& leases,
    const regions::RegionTable& regions, const access::Grants& grants) {
  const v1::TransferSpec& spec = request.spec();
  const uint64_t region_id = spec.dst().region_id();
  KVRAIL_RETURN_IF_ERROR(leases.Get(region_id, request.sender_node_id()).status());
  absl::StatusOr<std::shared_ptr<regions::Region>> dst = regions.Get(region_id);
  if (!dst.ok()) {
    return absl::NotFoundError(absl::StrCat("spec.dst.region_id: ", dst.status().message()));
  }
  const LayerRange layers = DestinationLayers((*dst)->view(), spec);
  KVRAIL_RETURN_IF_ERROR(grants.CheckAccess(**dst, /*session_id=*/0, spec.dst().grant(),
                                            v1::GRANT_ACCESS_WRITE, layers.begin, layers.end,
                                            "spec.dst"));
  return dst;
}

absl::StatusOr<InboundPlan> PlanInbound(const peer_v1::BeginRemoteTransferRequest& request,
                                        const planner::RegionView& dst, uint64_t slot_bytes) {
  const peer_v1::RemoteSource& source = request.source();
  KVRAIL_ASSIGN_OR_RETURN(
      planner::RegionView src_view,
      RemoteViewOf(source.size_bytes(), false, source.has_paged_kv() ? &source.paged_kv() : nullptr,
                   "source.paged_kv."));
  planner::PlanOptions plan_options;
  plan_options.tile_bytes = request.tile_bytes();
  KVRAIL_ASSIGN_OR_RETURN(planner::Plan plan,
                          planner::MakePlan(request.spec(), src_view, dst, plan_options));
  if (plan.bytes_total() != request.bytes_total() || plan.num_tiles() != request.tiles_total()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plans differ: the receiver's has ", plan.bytes_total(), " bytes in ", plan.num_tiles(),
        " tiles, the sender's ", request.bytes_total(), " in ", request.tiles_total()));
  }
  if (plan.header().tile_bytes + (request.spec().digest() ? kDigestTrailerBytes : 0) +
          kTileSealBytes >
      slot_bytes) {
    return absl::InvalidArgumentError("tile_bytes: larger than this daemon's staging slots");
  }
  return InboundPlan{std::move(src_view), std::move(plan)};
}

absl::Status CheckIntroduced(PeerConn& peer, uint64_t sender_boot_id) {
  absl::MutexLock lock(&peer.mu);
  if (!peer.introduced || peer.boot_id != sender_boot_id) {
    return absl::FailedPreconditionError("say hello first (unknown or changed boot id)");
  }
  return absl::OkStatus();
}

v1::RegionLease SourceLease(const peer_v1::BeginRemoteTransferRequest& request,
                            const std::string& holder_node_id) {
  v1::RegionLease lease;
  lease.set_region_id(request.spec().src().region_id());
  lease.set_owner_node_id(request.sender_node_id());
  lease.set_holder_node_id(holder_node_id);
  lease.set_size_bytes(request.source().size_bytes());
  if (request.source().has_paged_kv()) *lease.mutable_paged_kv() = request.source().paged_kv();
  return lease;
}

std::optional<uint32_t> NextFreeHandle(uint32_t next, const std::function<bool(uint32_t)>& taken) {
  for (uint32_t tried = 0; tried <= 0xffff; ++tried) {
    const uint32_t handle = (next + tried) & 0xffff;
    if (handle != 0 && !taken(handle)) return handle;
  }
  return std::nullopt;
}

}  // namespace kvrail::fabric
