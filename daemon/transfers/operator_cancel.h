// Internal to transfers/: who may cancel a transfer it did not submit (docs/security.md, "The
// operator"); TransferManager::Cancel applies it.
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/sessions/sessions.h"
#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::transfers {

// Whether `session_id` holds a region of its own in `regions` (a tenant), for the operator's
// cancel. Regions the client library registered for itself (RegionSpec.library_region: its
// block-table region, which the daemon limits to one small host bytes region per session that
// no transfer may name as source or destination) do not count; the name does not matter, so a
// region merely NAMED "client block tables" does.
inline bool SessionOwnsRegions(const std::vector<v1::RegionInfo>& regions, uint64_t session_id) {
  for (const v1::RegionInfo& info : regions) {
    if (info.session_id() == session_id && !info.spec().library_region()) return true;
  }
  return false;
}

// Whether `caller`, refused as a non-submitter, may still cancel another session's transfer as the
// operator. Only root (uid 0), and only from a session that owns no regions of its own (the
// kvrail CLI; the client library's block-table region does not count: SessionOwnsRegions).
// kvraild's own uid is NOT enough, though it may read every status: under MPS the inference
// servers run as kvraild's uid (docs/operations.md), and any of them could open a second,
// region-less session.
inline bool MayCancelAsOperator(const sessions::Caller& caller, bool session_owns_regions) {
  return caller.uid == 0 && !session_owns_regions;  // root: always operator_role()
}

}  // namespace kvrail::transfers
