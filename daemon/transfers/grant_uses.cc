#include "daemon/transfers/grant_uses.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kvrail::transfers {
namespace {

// Entries are pruned of ended transfers every this many adds (Recheck and Expire prune too).
constexpr uint64_t kPruneEvery = 256;

void AddIfGranted(std::vector<GrantUse>* uses, const std::shared_ptr<regions::Region>& region,
                  uint64_t session, const std::string& grant, v1::GrantAccess access,
                  LayerRange layers, const char* field) {
  if (region == nullptr || (session != 0 && region->session_id() == session)) return;
  uses->push_back(GrantUse{region, session, grant, access, layers.begin, layers.end, field});
}

}  // namespace

std::vector<GrantUse> GrantUsesOf(const ResolvedRequest& request) {
  std::vector<GrantUse> uses;
  const v1::TransferSpec& spec = *request.spec;
  const uint64_t session = spec.session_id();
  if (request.src != nullptr) {
    AddIfGranted(&uses, request.src, session, spec.src().grant(), v1::GRANT_ACCESS_READ,
                 TransferLayers(*request.src, spec, spec.src()), "spec.src");
  }
  if (!request.remote && request.dst != nullptr) {
    AddIfGranted(&uses, request.dst, session, spec.dst().grant(), v1::GRANT_ACCESS_WRITE,
                 TransferLayers(*request.dst, spec, spec.dst()), "spec.dst");
  }
  AddIfGranted(&uses, request.ready.region, session, spec.ready_flags().grant(),
               v1::GRANT_ACCESS_READ, LayerRange{}, "spec.ready_flags");
  AddIfGranted(&uses, request.arrival.region, session, spec.arrival_flags().grant(),
               v1::GRANT_ACCESS_WRITE, LayerRange{}, "spec.arrival_flags");
  return uses;
}

void GrantUses::Add(const std::shared_ptr<Record>& record, std::vector<GrantUse> uses) {
  if (uses.empty()) return;
  Entry entry;
  entry.record = record;
  entry.uses = std::move(uses);
  entry.expires_us = std::numeric_limits<int64_t>::max();
  for (const GrantUse& use : entry.uses) {
    // 0: already gone; Check below ends the record.
    entry.expires_us = std::min(entry.expires_us, grants_->GrantExpiresUs(use.grant));
  }
  const absl::Status held = Check(entry);
  if (!held.ok()) {
    EndRecord(record, held);
    return;
  }
  absl::MutexLock lock(&mu_);
  by_expiry_.emplace(entry.expires_us, record->id());
  entries_[record->id()] = std::move(entry);
  if (++adds_ % kPruneEvery == 0) PruneLocked();
}

absl::Status GrantUses::Check(const Entry& entry) const {
  for (const GrantUse& use : entry.uses) {
    const absl::Status held = grants_->CheckAccess(*use.region, use.session, use.grant, use.access,
                                                   use.layer_begin, use.layer_end, use.field);
    if (!held.ok()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the transfer ended: ", held.message(),
          " (the grant was revoked or expired, or its region was unregistered or its owner's "
          "session ended; nothing more moves on it)"));
    }
  }
  return absl::OkStatus();
}

void GrantUses::EndRecord(const std::shared_ptr<Record>& record, const absl::Status& why) {
  if (record->IsFinal()) return;
  // As TransferManagerImpl::End: queued tiles leave the engine first, then the record ends (tiles
  // already running still report; nothing new is queued: MarkReady adds nothing once it ended).
  const size_t removed = record->engine()->Remove(record.get());
  if (record->RequestEnd(why, removed)) {
    spdlog::info("transfer {} ending: {}", record->id(), why.ToString());
  }
}

void GrantUses::Recheck() {
  std::vector<std::pair<std::shared_ptr<Record>, Entry>> open;
  {
    absl::MutexLock lock(&mu_);
    PruneLocked();
    for (const auto& [id, entry] : entries_) {
      if (auto record = entry.record.lock()) open.emplace_back(std::move(record), entry);
    }
  }
  std::vector<uint64_t> ended;
  for (const auto& [record, entry] : open) {
    const absl::Status held = Check(entry);
    if (held.ok()) continue;
    EndRecord(record, held);
    ended.push_back(record->id());
  }
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ended) entries_.erase(id);
}

void GrantUses::Expire(int64_t now_us) {
  std::vector<std::shared_ptr<Record>> expired;
  {
    absl::MutexLock lock(&mu_);
    while (!by_expiry_.empty() && by_expiry_.begin()->first <= now_us) {
      const auto [expires_us, id] = *by_expiry_.begin();
      by_expiry_.erase(by_expiry_.begin());
      auto it = entries_.find(id);
      if (it == entries_.end() || it->second.expires_us != expires_us) continue;
      if (auto record = it->second.record.lock()) expired.push_back(std::move(record));
      entries_.erase(it);
    }
  }
  for (const auto& record : expired) {
    EndRecord(record, absl::PermissionDeniedError(
                          "the transfer ended: a grant it moves bytes on expired (nothing more "
                          "moves on it)"));
  }
}

bool GrantUses::UsesRegionOf(uint64_t id, uint64_t session) const {
  if (session == 0) return false;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  return std::any_of(
      it->second.uses.begin(), it->second.uses.end(),
      [session](const GrantUse& use) { return use.region->session_id() == session; });
}

size_t GrantUses::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

void GrantUses::PruneLocked() {
  by_expiry_.clear();
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto record = it->second.record.lock();
    if (record == nullptr || record->IsFinal()) {
      it = entries_.erase(it);
    } else {
      by_expiry_.emplace(it->second.expires_us, it->first);
      ++it;
    }
  }
}

}  // namespace kvrail::transfers
