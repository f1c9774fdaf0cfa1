// Hot restart (daemon/handover): quiescing before a handover, and the transfers a predecessor
// ended, which this manager answers by id as the predecessor would.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/transfers/manager_impl.h"

namespace kvrail::transfers {

absl::Status TransferManagerImpl::Quiesce(absl::Duration timeout) {
  // Measured by the injected clock, as Drain is; the real-time slices only pace the polling.
  const absl::Time until = clock_->Now() + timeout;
  while (true) {
    const uint64_t active = ActiveCount();
    if (active == 0) return absl::OkStatus();
    if (clock_->Now() >= until) {
      return absl::FailedPreconditionError(
          absl::StrCat(active, " transfers still run after ", absl::FormatDuration(timeout),
                       " (drain_timeout_ms); they are not cut short: this daemon keeps serving"));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

void TransferManagerImpl::ExportState(handover::TransferState* out) const {
  std::vector<std::shared_ptr<Record>> newest;
  {
    absl::MutexLock lock(&mu_);
    out->set_next_transfer_id(next_id_);
    newest = history_.Newest();
    // Inherited ones go on to the next successor too (after this manager's own, which are newer).
    for (const auto& [id, ended] : inherited_) *out->add_ended() = ended;
  }
  google::protobuf::RepeatedPtrField<handover::EndedTransfer> own;
  for (const auto& record : newest) {
    if (!record->IsFinal()) continue;  // Quiesce ended them all; inbound ones are not handed over
    handover::EndedTransfer* ended = own.Add();
    *ended->mutable_status() = record->Status();
    ended->set_submitter_session(record->submitter_session());
    ended->set_src_owner_session(record->inbound() ? 0 : record->src_owner_session());
    ended->set_dst_owner_session(record->dst_owner_session());
  }
  own.MergeFrom(out->ended());
  out->mutable_ended()->Swap(&own);
  while (out->ended_size() > static_cast<int>(options_.history)) out->mutable_ended()->RemoveLast();
}

void TransferManagerImpl::ImportState(const handover::TransferState& state) {
  absl::MutexLock lock(&mu_);
  next_id_ = std::max(next_id_, state.next_transfer_id());
  for (const handover::EndedTransfer& ended : state.ended()) {
    inherited_.emplace(ended.status().transfer_id(), ended);
  }
}

std::optional<handover::EndedTransfer> TransferManagerImpl::FindInherited(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = inherited_.find(id);
  if (it == inherited_.end()) return std::nullopt;
  return it->second;
}

absl::Status TransferManagerImpl::AuthorizeInherited(const handover::EndedTransfer& ended,
                                                     const sessions::Caller& caller, Use use) {
  const uint64_t id = ended.status().transfer_id();
  const bool known = caller.session_id != 0;
  if (known && ended.submitter_session() == caller.session_id) return absl::OkStatus();
  const bool source_owner = known && ended.src_owner_session() == caller.session_id;
  if (use == Use::kControl && source_owner) return absl::OkStatus();
  const bool reader =
      caller.operator_role() || (known && ended.dst_owner_session() == caller.session_id);
  if (use == Use::kRead && reader) return absl::OkStatus();
  // As for a transfer of this daemon's (Authorized): a caller with no part in it learns nothing.
  if (!reader && !source_owner) return UnknownTransfer(id);
  return absl::PermissionDeniedError(absl::StrCat(
      "transfer_id: transfer ", id, " was submitted by another session; only its submitter may ",
      use == Use::kRead ? "read its status (and the operator)" : "control it"));
}

}  // namespace kvrail::transfers
