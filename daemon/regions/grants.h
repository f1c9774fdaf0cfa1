// Internal to regions/: grants - capabilities a region's owner creates so that another party
// may read or write the region (Transfer.CreateGrant, TransferEndpoint.grant).
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::regions {

inline constexpr size_t kMaxGrantsPerSession = 4096;

// Thread-compatible: RegionTableImpl guards it with its mutex. Time is passed in (the table's
// injected clock).
class GrantTable {
 public:
  // A new grant for a region owned by `owner_session` (validated request). RESOURCE_EXHAUSTED
  // beyond kMaxGrantsPerSession live grants of the owner.
  absl::StatusOr<v1::Grant> Create(const v1::CreateGrantRequest& request, uint64_t owner_session,
                                   int64_t now_us);
  // The live grant `token` names, or NOT_FOUND naming `field` (unknown, revoked or expired).
  absl::StatusOr<v1::Grant> Find(absl::string_view token, int64_t now_us,
                                 absl::string_view field) const;
  // Removes a grant; false when unknown.
  bool Revoke(absl::string_view token);
  // Drops every grant of a region (unregistered) or of an owner session (ended).
  void DropRegion(uint64_t region_id);
  void DropOwner(uint64_t owner_session);
  size_t size() const { return grants_.size(); }

 private:
  struct Entry {
    v1::Grant grant;
    uint64_t owner_session = 0;
  };
  void DropExpired(int64_t now_us);
  absl::flat_hash_map<std::string, Entry> grants_;
};

// 32 lowercase hex digits from std::random_device (thread-safe).
std::string RandomHex128();

}  // namespace kvrail::regions
