#include "daemon/regions/grants.h"

#include <random>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvrail::regions {

std::string RandomHex128() {
  std::random_device random;
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&out, absl::Hex(random(), absl::kZeroPad8));
  return out;
}

absl::StatusOr<v1::Grant> GrantTable::Create(const v1::CreateGrantRequest& request,
                                             uint64_t owner_session, int64_t now_us) {
  DropExpired(now_us);
  size_t owned = 0;
  for (const auto& [token, entry] : grants_) owned += entry.owner_session == owner_session;
  if (owned >= kMaxGrantsPerSession) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "grants: the session holds ", owned, " live grants (at most ", kMaxGrantsPerSession,
        "); revoke some or let them expire"));
  }
  const uint64_t ttl_ms = request.ttl_ms() == 0 ? 600000 : request.ttl_ms();
  v1::Grant grant;
  grant.set_token(absl::StrCat("kvg1.", RandomHex128()));
  grant.set_region_id(request.region_id());
  grant.set_access(request.access());
  grant.set_expires_unix_us(now_us + static_cast<int64_t>(ttl_ms) * 1000);
  grant.set_layer_begin(request.layer_begin());
  grant.set_layer_end(request.layer_end());
  grants_[grant.token()] = Entry{grant, owner_session};
  return grant;
}

absl::StatusOr<v1::Grant> GrantTable::Find(absl::string_view token, int64_t now_us,
                                           absl::string_view field) const {
  auto it = grants_.find(token);
  if (it == grants_.end() || it->second.grant.expires_unix_us() <= now_us) {
    return absl::NotFoundError(absl::StrCat(field, ": unknown, revoked or expired grant"));
  }
  return it->second.grant;
}

bool GrantTable::Revoke(absl::string_view token) { return grants_.erase(token) > 0; }

void GrantTable::DropRegion(uint64_t region_id) {
  absl::erase_if(grants_, [&](const auto& kv) { return kv.second.grant.region_id() == region_id; });
}

void GrantTable::DropOwner(uint64_t owner_session) {
  absl::erase_if(grants_, [&](const auto& kv) { return kv.second.owner_session == owner_session; });
}

void GrantTable::DropExpired(int64_t now_us) {
  absl::erase_if(grants_, [&](const auto& kv) { return kv.second.grant.expires_unix_us() <= now_us; });
}

}  // namespace kvrail::regions
