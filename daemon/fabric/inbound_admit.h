// Internal to the fabric module: the receiver's admission of a BeginRemoteTransfer, one step per
// function (the receiver's Begin runs them in order). The steps that decide something are pure
// functions of the request and what the receiver looked up, unit-tested in
// inbound_admit_test.cc; the others look one thing up and name the request field on error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/access/access.h"
#include "daemon/fabric/leases.h"
#include "daemon/fabric/peers.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "proto/kvrail/peer/v1/peer.pb.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

// The destination layers a transfer writes, [begin, end), as the submitting node checks them (in
// 64 bits: a count that wraps cannot look like a small range). Both 0 for a flat region.
struct LayerRange {
  uint32_t begin = 0;
  uint32_t end = 0;
};
LayerRange DestinationLayers(const planner::RegionView& dst, const v1::TransferSpec& spec);

// The destination region, checked: the sender's node holds a lease on it (the export), and the
// sender's write grant (spec.dst.grant) allows writing these layers: an export alone lets nobody
// write (`grants` decides). Errors name spec.dst.
absl::StatusOr<std::shared_ptr<regions::Region>> AdmitDestination(
    const peer_v1::BeginRemoteTransferRequest& request, const Leases& leases,
    const regions::RegionTable& regions, const access::Grants& grants);

// The receiver's plan, made from the sender's description of the source (request.source) and
// the destination's view; it must agree with the sender's (bytes_total, tiles_total), and its
// tiles (with the digest trailer and the seal) must fit this daemon's `slot_bytes`.
struct InboundPlan {
  planner::RegionView src_view;
  planner::Plan plan;
};
absl::StatusOr<InboundPlan> PlanInbound(const peer_v1::BeginRemoteTransferRequest& request,
                                        const planner::RegionView& dst, uint64_t slot_bytes);

// The sender said hello with this boot id (a sender that restarted must introduce itself again).
// Takes peer.mu.
absl::Status CheckIntroduced(PeerConn& peer, uint64_t sender_boot_id);

// The lease standing for the sender's source region in this node's record of the transfer.
v1::RegionLease SourceLease(const peer_v1::BeginRemoteTransferRequest& request,
                            const std::string& holder_node_id);

// The next free 16-bit handle from `next` on (0 is never one); nullopt when all are `taken`.
std::optional<uint32_t> NextFreeHandle(uint32_t next, const std::function<bool(uint32_t)>& taken);

}  // namespace kvrail::fabric
