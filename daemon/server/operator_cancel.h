// Who may cancel a transfer it did not submit (docs/security.md, "The operator").
#pragma once

#include "daemon/regions/regions.h"

namespace kvrail::server {

// Whether `caller`, refused as a non-submitter, may still cancel another session's transfer as the
// operator. Only root (uid 0), and only from a session that owns no regions of its own (the
// kvrail CLI; the client library's block-table region does not count). kvraild's own uid is NOT
// enough, though it may read every status: under MPS the inference servers run as kvraild's uid
// (docs/operations.md), and any of them could open a second, region-less session.
inline bool MayCancelAsOperator(const regions::Caller& caller, bool session_owns_regions) {
  return caller.operator_role && caller.uid == 0 && !session_owns_regions;
}

}  // namespace kvrail::server
