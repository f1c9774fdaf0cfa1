// Access: who may read or write a registered region (docs/security.md). A region's owning
// session may use it; anyone else needs a grant - a capability its owner creates
// (Transfer.CreateGrant) and passes on, naming the region, the access (read or write), a time to
// live and optionally a layer range. Grants end when revoked, when they expire, when their region
// is unregistered and when their owner's session ends; hooks then tell the transfer manager to
// recheck the transfers moving bytes on them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/clock.h"
#include "daemon/handover/state.pb.h"
#include "daemon/regions/regions.h"
#include "daemon/sessions/sessions.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::access {

// Live grants one session may hold at once.
inline constexpr size_t kMaxGrantsPerSession = 4096;

// The daemon's grants. Thread-safe. Create it before sessions begin (it hooks the session and
// region tables); both tables must outlive it, and it must outlive their last EndSession and
// Unregister.
class Grants {
 public:
  virtual ~Grants() = default;
  // Grants expire by `clock`.
  static std::unique_ptr<Grants> Create(Clock* clock, sessions::SessionTable* sessions,
                                        regions::RegionTable* regions);

  // A grant of `request.region_id` by its owner. INVALID_ARGUMENT naming the field (access,
  // ttl_ms, layer range), NOT_FOUND for unknown regions, PERMISSION_DENIED when the caller does
  // not own the region, RESOURCE_EXHAUSTED beyond kMaxGrantsPerSession live grants.
  virtual absl::StatusOr<v1::Grant> CreateGrant(const v1::CreateGrantRequest& request,
                                                const sessions::Caller& caller) = 0;
  // NOT_FOUND naming token for unknown or expired grants; PERMISSION_DENIED unless the caller
  // owns the grant's region.
  virtual absl::Status RevokeGrant(const std::string& token, const sessions::Caller& caller) = 0;
  // When the live grant `token` expires (unix microseconds by the clock); 0 when it is unknown,
  // revoked or expired.
  virtual int64_t GrantExpiresUs(absl::string_view token) const = 0;
  // OK when session `session_id` (0: none) owns `region`, or `grant` is a live grant of
  // `access` for it covering layers [layer_begin, layer_end) (both 0: the transfer's layers are
  // not known or the region is a bytes region: only whole-region grants pass). Otherwise
  // PERMISSION_DENIED naming `field` (".grant" or ".region_id"); its message never contains the
  // region's contents.
  virtual absl::Status CheckAccess(const regions::Region& region, uint64_t session_id,
                                   const std::string& grant, v1::GrantAccess access,
                                   uint32_t layer_begin, uint32_t layer_end,
                                   absl::string_view field) const = 0;
  // Adds `hook`, called whenever access that was granted may have ended: after RevokeGrant, an
  // Unregister (its grants go with the region) and a session's end (the owner's grants go with
  // it; after the session's other end hooks), outside any lock, on the thread that made the
  // change, before that call returns. The transfer manager rechecks its transfers' grants there.
  // Hooks live as long as the grants.
  virtual void AddAccessHook(std::function<void()> hook) = 0;

  // --- Hot restart (daemon/handover) ---
  // The live grants with their owner sessions, the grants' part of the state a successor
  // rebuilds. The grants are unchanged and keep serving.
  virtual void ExportState(handover::RegionTableState* out) const = 0;
  // Takes a predecessor's grants (after the session and region tables imported theirs); one
  // that expired meanwhile, or is held already, is skipped.
  virtual void ImportState(const handover::RegionTableState& state) = 0;
};

}  // namespace kvrail::access
