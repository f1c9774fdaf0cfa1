// Internal to access/: the grant table - capabilities a region's owner creates so that another
// party may read or write the region (Transfer.CreateGrant, TransferEndpoint.grant).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/access/access.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::access {

// Thread-compatible: GrantsImpl guards it with its mutex. Time is passed in (the table's
// injected clock). Create and Revoke cost O(log n) (per-owner counts and an expiry index: they
// run under the grants' lock, which every submit using a grant takes; a scan of every grant cost
// 4.6 ms at 131k grants); DropRegion and DropOwner scan.
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
  // Every grant with its owner session (a hot restart hands them over), and the way back: a
  // grant the table already holds, or one that expired by `now_us`, is skipped.
  std::vector<std::pair<v1::Grant, uint64_t>> All() const;
  void Restore(const v1::Grant& grant, uint64_t owner_session, int64_t now_us);

 private:
  struct Entry {
    v1::Grant grant;
    uint64_t owner_session = 0;
    std::multimap<int64_t, std::string>::iterator by_expiry;
  };
  void DropExpired(int64_t now_us);
  // Removes `it` and its index entries.
  void Erase(absl::flat_hash_map<std::string, Entry>::iterator it);
  absl::flat_hash_map<std::string, Entry> grants_;
  absl::flat_hash_map<uint64_t, size_t> per_owner_;  // live grants per owner session
  std::multimap<int64_t, std::string> by_expiry_;    // (expires_unix_us, token)
};

}  // namespace kvrail::access
