#include "daemon/access/access.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "daemon/access/grant_table.h"

namespace kvrail::access {
namespace {

// Thread-safe: the grant table and the hooks are guarded by mu_; hooks run outside it. Region
// lookups go to the region table (its own lock), never under mu_.
class GrantsImpl final : public Grants {
 public:
  GrantsImpl(Clock* clock, regions::RegionTable* regions) : clock_(clock), regions_(regions) {}

  absl::StatusOr<v1::Grant> CreateGrant(const v1::CreateGrantRequest& request,
                                        const sessions::Caller& caller) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (request.access() != v1::GRANT_ACCESS_READ && request.access() != v1::GRANT_ACCESS_WRITE) {
      return absl::InvalidArgumentError("access: GRANT_ACCESS_READ or GRANT_ACCESS_WRITE");
    }
    if (request.ttl_ms() > 86400000) {
      return absl::InvalidArgumentError(
          absl::StrCat("ttl_ms: ", request.ttl_ms(), " is more than a day (86400000)"));
    }
    if (request.layer_end() < request.layer_begin() ||
        (request.layer_end() == request.layer_begin() && request.layer_begin() != 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer_end: ", request.layer_end(), " must be above layer_begin ",
                       request.layer_begin(), " (both 0: every layer)"));
    }
    std::shared_ptr<regions::Region> found = regions_->Find(request.region_id());
    if (found == nullptr) {
      return absl::NotFoundError(absl::StrCat("region_id: no region ", request.region_id()));
    }
    const regions::Region& region = *found;
    if (caller.session_id == 0 || region.session_id() != caller.session_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("region_id: region ", request.region_id(),
                       " belongs to another session; only its owner may grant access to it"));
    }
    if (region.spec().library_region()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "region_id: region ", request.region_id(),
          " is a client library's own region (RegionSpec.library_region); it cannot be granted"));
    }
    if (request.access() == v1::GRANT_ACCESS_WRITE && !region.spec().writable()) {
      return absl::FailedPreconditionError(absl::StrCat("access: region ", request.region_id(),
                                                        " is not writable (RegionSpec.writable)"));
    }
    if (request.layer_end() != 0 &&
        (!region.view().paged || request.layer_end() > region.view().layout.num_layers)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer_end: ", request.layer_end(), " is beyond the region's layers"));
    }
    absl::StatusOr<v1::Grant> grant;
    {
      absl::MutexLock lock(&mu_);
      grant = grants_.Create(request, region.session_id(), clock_->NowUnixMicros());
    }
    // An Unregister that raced with this call dropped the region's grants before this one
    // existed: it goes too (the region is gone).
    if (grant.ok() && regions_->Find(request.region_id()) == nullptr) {
      absl::MutexLock lock(&mu_);
      grants_.Revoke(grant->token());
      return absl::NotFoundError(absl::StrCat("region_id: no region ", request.region_id()));
    }
    return grant;
  }

  absl::Status RevokeGrant(const std::string& token, const sessions::Caller& caller) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    v1::Grant grant;
    {
      absl::MutexLock lock(&mu_);
      KVRAIL_ASSIGN_OR_RETURN(grant, grants_.Find(token, clock_->NowUnixMicros(), "token"));
    }
    std::shared_ptr<regions::Region> region = regions_->Find(grant.region_id());
    const bool owner =
        region != nullptr && caller.session_id != 0 && region->session_id() == caller.session_id;
    if (!owner) {
      return absl::PermissionDeniedError(
          "token: only the owner of the grant's region may revoke it");
    }
    {
      absl::MutexLock lock(&mu_);
      grants_.Revoke(token);
    }
    // The transfers moving bytes on it end before the owner hears the revocation succeeded.
    RunAccessHooks();
    return absl::OkStatus();
  }

  int64_t GrantExpiresUs(absl::string_view token) const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<v1::Grant> found = grants_.Find(token, clock_->NowUnixMicros(), "token");
    return found.ok() ? found->expires_unix_us() : 0;
  }

  absl::Status CheckAccess(const regions::Region& region, uint64_t session_id,
                           const std::string& grant, v1::GrantAccess access, uint32_t layer_begin,
                           uint32_t layer_end, absl::string_view field) const override
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (region.spec().library_region()) {
      // Only block_table references read it (transfers/resolve.cc, its own session's).
      return absl::PermissionDeniedError(absl::StrCat(
          field, ".region_id: region ", region.id(),
          " is a client library's own region (RegionSpec.library_region: block tables); it is "
          "not a transfer's source, destination or flag words"));
    }
    if (session_id != 0 && region.session_id() == session_id) return absl::OkStatus();
    const char* verb = access == v1::GRANT_ACCESS_WRITE ? "write" : "read";
    if (grant.empty()) {
      return absl::PermissionDeniedError(absl::StrCat(
          field, ".region_id: region ", region.id(), " belongs to another session; to ", verb,
          " it, pass a grant of its owner in ", field, ".grant (Transfer.CreateGrant)"));
    }
    const std::string grant_field = absl::StrCat(field, ".grant");
    absl::MutexLock lock(&mu_);
    absl::StatusOr<v1::Grant> found = grants_.Find(grant, clock_->NowUnixMicros(), grant_field);
    if (!found.ok()) return absl::PermissionDeniedError(found.status().message());
    if (found->region_id() != region.id()) {
      return absl::PermissionDeniedError(absl::StrCat(grant_field, ": the grant is for region ",
                                                      found->region_id(), ", not region ",
                                                      region.id()));
    }
    if (found->access() != access) {
      return absl::PermissionDeniedError(absl::StrCat(
          grant_field, ": the grant lets the holder ",
          found->access() == v1::GRANT_ACCESS_WRITE ? "write" : "read", ", not ", verb));
    }
    if (found->layer_end() != 0 &&
        (layer_end == 0 || layer_begin < found->layer_begin() || layer_end > found->layer_end())) {
      return absl::PermissionDeniedError(absl::StrCat(
          grant_field, ": the grant covers layers [", found->layer_begin(), ", ",
          found->layer_end(), "), the transfer touches [", layer_begin, ", ", layer_end, ")"));
    }
    return absl::OkStatus();
  }

  void AddAccessHook(std::function<void()> hook) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    access_hooks_.push_back(std::move(hook));
  }

  void ExportState(handover::RegionTableState* out) const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (const auto& [grant, owner] : grants_.All()) {
      handover::GrantRecord* record = out->add_grants();
      *record->mutable_grant() = grant;
      record->set_owner_session(owner);
    }
  }

  void ImportState(const handover::RegionTableState& state) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const int64_t now_us = clock_->NowUnixMicros();
    for (const handover::GrantRecord& record : state.grants()) {
      grants_.Restore(record.grant(), record.owner_session(), now_us);
    }
  }

  // The region table's unregister hook: the region's grants go with it.
  void DropRegion(uint64_t region_id) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      grants_.DropRegion(region_id);
    }
    RunAccessHooks();
  }

  // A session's end: its grants go with it (an early end hook, so no transfer is admitted on
  // them meanwhile) ...
  void DropOwner(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    grants_.DropOwner(session_id);
  }

  // ... and the transfers using them are rechecked after the session's other end hooks.
  void RunAccessHooks() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::function<void()>> hooks;
    {
      absl::MutexLock lock(&mu_);
      hooks = access_hooks_;
    }
    for (const auto& hook : hooks) hook();
  }

 private:
  Clock* const clock_;
  regions::RegionTable* const regions_;
  mutable absl::Mutex mu_;
  GrantTable grants_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> access_hooks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Grants> Grants::Create(Clock* clock, sessions::SessionTable* sessions,
                                       regions::RegionTable* regions) {
  auto grants = std::make_unique<GrantsImpl>(clock, regions);
  GrantsImpl* raw = grants.get();
  sessions->AddSessionEndHook([raw](uint64_t session) { raw->DropOwner(session); });
  sessions->AddSessionEndHook([raw](uint64_t) { raw->RunAccessHooks(); }, /*after_others=*/true);
  regions->AddUnregisterHook([raw](uint64_t region_id) { raw->DropRegion(region_id); });
  return grants;
}

}  // namespace kvrail::access
