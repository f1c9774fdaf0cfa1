// Internal to the fabric module: which of this node's regions are exported to which peers (a peer
// may write a region only once a local client exported it), the leases that follow, and the
// stand-in Region for the other node's side of a transfer (a lease's view, no local bytes).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/fabric/peers.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::fabric {

// Thread contract: thread-safe; mu_ guards the export table.
class Leases {
 public:
  Leases(std::string node_id, regions::RegionTable* regions, const PeerTable* peers)
      : node_id_(std::move(node_id)), regions_(regions), peers_(peers) {}

  // Exports `region_id` to `peer_node` (which must be in the directory) and returns its lease.
  absl::StatusOr<v1::RegionLease> Export(uint64_t region_id, const std::string& peer_node);
  // The lease of `region_id` for `requester`: PERMISSION_DENIED unless exported to it.
  absl::StatusOr<v1::RegionLease> Get(uint64_t region_id, const std::string& requester) const;

 private:
  const std::string node_id_;
  regions::RegionTable* const regions_;
  const PeerTable* const peers_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::set<std::string>> exports_ ABSL_GUARDED_BY(mu_);
};

// A region on another node as this one sees it through `lease`: the planner's `view` only (no
// local address). Named "<what> region <id> on '<owner>'". Immutable; thread-safe.
std::shared_ptr<regions::Region> MakeLeasedRegion(v1::RegionLease lease, planner::RegionView view,
                                                  const std::string& what = "lease of");

// The planner's view of a remote region of `size` bytes (paged when `paged` is set); errors name
// fields under `field`.
absl::StatusOr<planner::RegionView> RemoteViewOf(uint64_t size, bool writable,
                                                 const v1::PagedKvLayout* paged,
                                                 const std::string& field);

}  // namespace kvrail::fabric
