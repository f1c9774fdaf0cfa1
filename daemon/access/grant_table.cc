#include "daemon/access/grant_table.h"

#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/sessions/sessions.h"

namespace kvrail::access {

absl::StatusOr<v1::Grant> GrantTable::Create(const v1::CreateGrantRequest& request,
                                             uint64_t owner_session, int64_t now_us) {
  DropExpired(now_us);
  auto counted = per_owner_.find(owner_session);
  const size_t owned = counted == per_owner_.end() ? 0 : counted->second;
  if (owned >= kMaxGrantsPerSession) {
    return absl::ResourceExhaustedError(absl::StrCat("grants: the session holds ", owned,
                                                     " live grants (at most ", kMaxGrantsPerSession,
                                                     "); revoke some or let them expire"));
  }
  const uint64_t ttl_ms = request.ttl_ms() == 0 ? 600000 : request.ttl_ms();
  v1::Grant grant;
  grant.set_token(absl::StrCat("kvg1.", sessions::RandomHex128()));
  grant.set_region_id(request.region_id());
  grant.set_access(request.access());
  grant.set_expires_unix_us(now_us + static_cast<int64_t>(ttl_ms) * 1000);
  grant.set_layer_begin(request.layer_begin());
  grant.set_layer_end(request.layer_end());
  auto expiry = by_expiry_.emplace(grant.expires_unix_us(), grant.token());
  grants_[grant.token()] = Entry{grant, owner_session, expiry};
  ++per_owner_[owner_session];
  return grant;
}

std::vector<std::pair<v1::Grant, uint64_t>> GrantTable::All() const {
  std::vector<std::pair<v1::Grant, uint64_t>> all;
  all.reserve(grants_.size());
  for (const auto& [token, entry] : grants_) all.emplace_back(entry.grant, entry.owner_session);
  return all;
}

void GrantTable::Restore(const v1::Grant& grant, uint64_t owner_session, int64_t now_us) {
  if (grant.expires_unix_us() <= now_us || grants_.contains(grant.token())) return;
  auto expiry = by_expiry_.emplace(grant.expires_unix_us(), grant.token());
  grants_[grant.token()] = Entry{grant, owner_session, expiry};
  ++per_owner_[owner_session];
}

void GrantTable::Erase(absl::flat_hash_map<std::string, Entry>::iterator it) {
  by_expiry_.erase(it->second.by_expiry);
  auto counted = per_owner_.find(it->second.owner_session);
  if (counted != per_owner_.end() && --counted->second == 0) per_owner_.erase(counted);
  grants_.erase(it);
}

absl::StatusOr<v1::Grant> GrantTable::Find(absl::string_view token, int64_t now_us,
                                           absl::string_view field) const {
  auto it = grants_.find(token);
  if (it == grants_.end() || it->second.grant.expires_unix_us() <= now_us) {
    return absl::NotFoundError(absl::StrCat(field, ": unknown, revoked or expired grant"));
  }
  return it->second.grant;
}

bool GrantTable::Revoke(absl::string_view token) {
  auto it = grants_.find(token);
  if (it == grants_.end()) return false;
  Erase(it);
  return true;
}

void GrantTable::DropRegion(uint64_t region_id) {
  for (auto it = grants_.begin(); it != grants_.end();) {
    auto next = std::next(it);
    if (it->second.grant.region_id() == region_id) Erase(it);
    it = next;
  }
}

void GrantTable::DropOwner(uint64_t owner_session) {
  for (auto it = grants_.begin(); it != grants_.end();) {
    auto next = std::next(it);
    if (it->second.owner_session == owner_session) Erase(it);
    it = next;
  }
}

void GrantTable::DropExpired(int64_t now_us) {
  while (!by_expiry_.empty() && by_expiry_.begin()->first <= now_us) {
    auto it = grants_.find(by_expiry_.begin()->second);
    if (it == grants_.end()) {
      by_expiry_.erase(by_expiry_.begin());  // not reached: every grant is indexed once
      continue;
    }
    Erase(it);
  }
}

}  // namespace kvrail::access
