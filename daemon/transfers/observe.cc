// Requests about admitted transfers: status, waits, watches, cancel, readiness, lists, stats.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "daemon/transfers/manager_impl.h"
#include "daemon/transfers/operator_cancel.h"
#include "spdlog/spdlog.h"

namespace kvrail::transfers {

absl::StatusOr<std::shared_ptr<Record>> TransferManagerImpl::Authorized(
    uint64_t id, const sessions::Caller& caller, Use use) const {
  KVRAIL_ASSIGN_OR_RETURN(auto record, Find(id));
  const bool submitter = caller.session_id != 0 && record->submitter_session() == caller.session_id;
  if (submitter) return record;
  if (use == Use::kCancel && grant_uses_->UsesRegionOf(id, caller.session_id)) return record;
  // A pull's producer: the owner of its source region marks the layers it wrote ready, with no
  // grant of the submitter's (the source owner already let the transfer read them).
  if (use == Use::kControl && caller.session_id != 0 && !record->inbound() &&
      record->src_owner_session() == caller.session_id) {
    return record;
  }
  const bool reader = caller.operator_role() ||
                      (caller.session_id != 0 && record->dst_owner_session() == caller.session_id);
  if (use == Use::kRead && reader) return record;
  // A caller with no part in the transfer learns nothing of it, not even that it exists: the
  // answer is the unknown id's, code and message alike. Its readers, the owner of a region it
  // uses by a grant (who may cancel it) and its source's owner (who may mark it ready) are
  // told why they may not do this.
  const bool party =
      reader || (caller.session_id != 0 &&
                 (grant_uses_->UsesRegionOf(id, caller.session_id) ||
                  (!record->inbound() && record->src_owner_session() == caller.session_id)));
  if (!party) return UnknownTransfer(id);
  // The operator too may not control a tenant's transfer here; Cancel lets root cancel one from
  // a session that owns no regions, audited (docs/security.md).
  return absl::PermissionDeniedError(absl::StrCat(
      "transfer_id: transfer ", id, " was submitted by another session; only its submitter may ",
      use == Use::kRead      ? "read its status (and the operator)"
      : use == Use::kControl ? "mark its layers ready (and its source region's owner)"
                             : "cancel it (and the owner of a region it uses by a grant; "
                               "the operator may cancel it with kvrail transfers cancel)"));
}

absl::StatusOr<v1::TransferStatus> TransferManagerImpl::Get(const sessions::Caller& caller,
                                                            uint64_t id) const {
  if (std::optional<handover::EndedTransfer> ended = FindInherited(id)) {
    KVRAIL_RETURN_IF_ERROR(AuthorizeInherited(*ended, caller, Use::kRead));
    return ended->status();
  }
  KVRAIL_ASSIGN_OR_RETURN(auto record, Authorized(id, caller, Use::kRead));
  return record->Status();
}

absl::StatusOr<v1::TransferStatus> TransferManagerImpl::Wait(const sessions::Caller& caller,
                                                             uint64_t id,
                                                             absl::Duration timeout) const {
  if (std::optional<handover::EndedTransfer> ended = FindInherited(id)) {
    KVRAIL_RETURN_IF_ERROR(AuthorizeInherited(*ended, caller, Use::kRead));
    return ended->status();
  }
  KVRAIL_ASSIGN_OR_RETURN(auto record, Authorized(id, caller, Use::kRead));
  // The timeout is measured by the injected clock (as deadlines are); waiting happens in short
  // real-time slices, so a clock that a test moves by hand ends the wait on the next slice.
  const absl::Time until = clock_->Now() + timeout;
  while (!record->IsFinal()) {
    const absl::Duration left = until - clock_->Now();
    if (left <= absl::ZeroDuration()) break;
    record->AwaitChange(record->version(), std::min(left, absl::Milliseconds(20)));
  }
  return record->Status();
}

absl::Status TransferManagerImpl::WhenEnded(const sessions::Caller& caller, uint64_t id,
                                            std::function<void(const v1::TransferStatus&)> done,
                                            bool counted, StatusDetail detail) const {
  if (std::optional<handover::EndedTransfer> ended = FindInherited(id)) {
    KVRAIL_RETURN_IF_ERROR(AuthorizeInherited(*ended, caller, Use::kRead));
    done(ended->status());
    return absl::OkStatus();
  }
  KVRAIL_ASSIGN_OR_RETURN(auto record, Authorized(id, caller, Use::kRead));
  return record->WhenEnded(std::move(done), counted, detail);
}

absl::Status TransferManagerImpl::WatchStep(const sessions::Caller& caller, uint64_t id,
                                            absl::Duration min_interval, WatchCursor* cursor,
                                            std::vector<v1::TransferEvent>* events) const {
  if (cursor->over) return absl::OkStatus();
  if (cursor->record == nullptr) {
    if (std::optional<handover::EndedTransfer> ended = FindInherited(id)) {
      KVRAIL_RETURN_IF_ERROR(AuthorizeInherited(*ended, caller, Use::kRead));
      v1::TransferEvent event;  // ended already: the snapshot is the whole story
      event.set_kind(v1::TransferEvent::KIND_SNAPSHOT);
      *event.mutable_status() = ended->status();
      cursor->over = true;
      events->push_back(std::move(event));
      return absl::OkStatus();
    }
    KVRAIL_ASSIGN_OR_RETURN(cursor->record, Authorized(id, caller, Use::kRead));
    const Record& record = *cursor->record;
    cursor->version = record.version();
    v1::TransferEvent event;
    event.set_kind(v1::TransferEvent::KIND_SNAPSHOT);
    *event.mutable_status() = record.Status();
    cursor->state = event.status().state();
    cursor->bytes = event.status().bytes_done();
    cursor->layers_sent = record.LayersDone().size();
    cursor->last_progress = clock_->Now();
    cursor->over = cursor->state >= v1::TRANSFER_STATE_SUCCEEDED;
    events->push_back(std::move(event));
    return absl::OkStatus();
  }
  const Record& record = *cursor->record;
  const uint64_t version = record.version();
  const bool progress_due =
      cursor->bytes_pending && clock_->Now() - cursor->last_progress >= min_interval;
  if (version == cursor->version && !progress_due) return absl::OkStatus();
  cursor->version = version;
  v1::TransferStatus status = record.Status();
  const std::vector<uint32_t> layers = record.LayersDone();
  for (; cursor->layers_sent < layers.size(); ++cursor->layers_sent) {
    v1::TransferEvent layer_event;
    layer_event.set_kind(v1::TransferEvent::KIND_LAYER_DONE);
    layer_event.set_layer(status.spec().src().layer_begin() + layers[cursor->layers_sent]);
    *layer_event.mutable_status() = status;
    events->push_back(std::move(layer_event));
  }
  v1::TransferEvent next;
  if (status.state() != cursor->state) {
    next.set_kind(v1::TransferEvent::KIND_STATE);
    cursor->state = status.state();
  } else if (status.bytes_done() != cursor->bytes) {
    if (clock_->Now() - cursor->last_progress < min_interval) {
      cursor->bytes_pending = true;  // sent once min_interval has passed (or with the next state)
      return absl::OkStatus();
    }
    next.set_kind(v1::TransferEvent::KIND_PROGRESS);
  } else {
    return absl::OkStatus();
  }
  cursor->bytes = status.bytes_done();
  cursor->bytes_pending = false;
  cursor->last_progress = clock_->Now();
  cursor->over = cursor->state >= v1::TRANSFER_STATE_SUCCEEDED;
  *next.mutable_status() = std::move(status);
  events->push_back(std::move(next));
  return absl::OkStatus();
}

absl::Status TransferManagerImpl::Watch(const sessions::Caller& caller, uint64_t id,
                                        absl::Duration min_interval,
                                        const std::function<bool(const v1::TransferEvent&)>& sink,
                                        const std::function<bool()>& still_wanted) const {
  WatchCursor cursor;
  std::vector<v1::TransferEvent> events;
  while (true) {
    events.clear();
    KVRAIL_RETURN_IF_ERROR(WatchStep(caller, id, min_interval, &cursor, &events));
    for (const v1::TransferEvent& event : events) {
      if (!sink(event)) return absl::OkStatus();
    }
    if (cursor.over) return absl::OkStatus();
    cursor.record->AwaitChange(cursor.version, absl::Milliseconds(100));
    if (still_wanted && !still_wanted()) return absl::OkStatus();
  }
}

absl::StatusOr<v1::TransferStatus> TransferManagerImpl::Cancel(const sessions::Caller& caller,
                                                               uint64_t id) {
  // An inherited transfer has ended: its submitter's cancel changes nothing, as for a record here.
  if (std::optional<handover::EndedTransfer> ended = FindInherited(id)) {
    KVRAIL_RETURN_IF_ERROR(AuthorizeInherited(*ended, caller, Use::kCancel));
    return ended->status();
  }
  absl::StatusOr<std::shared_ptr<Record>> allowed = Authorized(id, caller, Use::kCancel);
  // Root may cancel another session's transfer - a stuck or runaway one - from a session that
  // owns no regions (the kvrail CLI): MayCancelAsOperator. Every such cancel is an audit
  // line naming its uid. kvraild's own uid reads every status but cancels only its own: under
  // MPS the inference servers run as that uid.
  if (allowed.status().code() == absl::StatusCode::kPermissionDenied && caller.operator_role()) {
    if (!MayCancelAsOperator(caller, SessionOwnsRegions(regions_->List(), caller.session_id))) {
      return absl::PermissionDeniedError(
          absl::StrCat(allowed.status().message(),
                       "; only root may cancel another session's transfer, and "
                       "only from a session that owns no regions"));
    }
    KVRAIL_ASSIGN_OR_RETURN(allowed, Find(id));
    const v1::TransferStatus before = (*allowed)->Status();
    LogFields(spdlog::level::warn, "audit: the operator cancels another session's transfer",
              {{"operator_uid", caller.uid},
               {"operator_session", caller.session_id},
               {"transfer_id", id},
               {"submitter_session", before.spec().session_id()},
               {"state", v1::TransferState_Name(before.state())}});
  }
  KVRAIL_ASSIGN_OR_RETURN(auto record, std::move(allowed));
  if (record->inbound() && !record->IsFinal()) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer_id: transfer ", id, " is written into this node by another (",
                     record->Status().path_reason(), "); cancel it on the sending node"));
  }
  End(record, absl::CancelledError("cancelled by a client"));
  return record->Status();
}

absl::Status TransferManagerImpl::MarkReady(const sessions::Caller& caller, uint64_t id,
                                            uint32_t layer_begin, uint32_t layer_count) {
  if (std::optional<handover::EndedTransfer> ended = FindInherited(id)) {
    KVRAIL_RETURN_IF_ERROR(AuthorizeInherited(*ended, caller, Use::kControl));
    return absl::FailedPreconditionError(
        absl::StrCat("transfer_id: transfer ", id, " has ended (before kvraild's hot restart)"));
  }
  KVRAIL_ASSIGN_OR_RETURN(auto record, Authorized(id, caller, Use::kControl));
  KVRAIL_ASSIGN_OR_RETURN(std::vector<uint32_t> tiles,
                          record->MarkReady(layer_begin, layer_count == 0 ? 1 : layer_count));
  record->engine()->Enqueue(record, tiles);
  return absl::OkStatus();
}

std::vector<v1::TransferStatus> TransferManagerImpl::List(
    const sessions::Caller& caller, const std::vector<v1::TransferState>& states,
    uint32_t limit) const {
  ListFilter filter;
  filter.states = states;
  filter.limit = limit;
  return List(caller, filter);
}

bool TransferManagerImpl::ListableBy(const sessions::Caller& caller, ListFilter* filter) {
  if (caller.operator_role()) return true;   // every transfer
  if (caller.session_id == 0) return false;  // anonymous callers own none
  if (filter->session_id != 0 && filter->session_id != caller.session_id) return false;
  filter->session_id = caller.session_id;
  return true;
}

absl::StatusOr<std::vector<v1::TransferStatus>> TransferManagerImpl::ListChecked(
    const sessions::Caller& caller, const ListFilter& given) const {
  ListFilter filter = given;
  if (!ListableBy(caller, &filter)) return std::vector<v1::TransferStatus>();
  if (filter.limit > options_.max_list_transfers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "limit: ", filter.limit, " is above max_list_transfers (", options_.max_list_transfers,
        ", DaemonConfig.max_list_transfers); filter by state, region, label or key"));
  }
  return ListUnchecked(filter);
}

std::vector<v1::TransferStatus> TransferManagerImpl::List(const sessions::Caller& caller,
                                                          const ListFilter& given) const {
  ListFilter filter = given;
  if (!ListableBy(caller, &filter)) return {};
  return ListUnchecked(filter);
}

std::vector<v1::TransferStatus> TransferManagerImpl::ListUnchecked(const ListFilter& filter) const {
  const uint32_t limit = filter.limit == 0 ? 100 : filter.limit;
  std::vector<std::shared_ptr<Record>> newest;
  {
    absl::MutexLock lock(&mu_);
    newest = history_.Newest();
  }
  const auto& states = filter.states;
  std::vector<v1::TransferStatus> out;
  for (const auto& record : newest) {
    if (out.size() >= limit) break;
    // Before the status is copied: a tenant's list skips others' transfers cheaply.
    if (filter.session_id != 0 && record->submitter_session() != filter.session_id) continue;
    v1::TransferStatus status = record->Status();
    if (!states.empty() &&
        std::find(states.begin(), states.end(), status.state()) == states.end()) {
      continue;
    }
    const v1::TransferSpec& spec = status.spec();
    if (!filter.label.empty() && spec.label() != filter.label) continue;
    if (!filter.idempotency_key.empty() && spec.idempotency_key() != filter.idempotency_key) {
      continue;
    }
    if (filter.region_id != 0) {
      // Only this node's side(s): an inbound transfer's source and an outbound fabric transfer's
      // destination are region ids of another daemon.
      const bool fabric = status.path() == v1::PATH_FABRIC;
      const bool src_here = !(fabric && record->inbound());
      const bool dst_here = !(fabric && !record->inbound());
      if (!(src_here && spec.src().region_id() == filter.region_id) &&
          !(dst_here && spec.dst().region_id() == filter.region_id)) {
        continue;
      }
    }
    out.push_back(std::move(status));
  }
  return out;
}

void TransferManagerImpl::FillStats(v1::Stats* stats) const {
  {
    absl::MutexLock c(&counters_->mu);
    stats->set_transfers_submitted(counters_->submitted);
    stats->set_transfers_succeeded(counters_->succeeded);
    stats->set_transfers_failed(counters_->failed);
    stats->set_transfers_cancelled(counters_->cancelled);
    stats->set_transfers_active(counters_->active);
    stats->set_bytes_moved(counters_->bytes_moved);
    for (const auto& [path, bytes] : counters_->bytes_by_path) {
      (*stats->mutable_bytes_by_path())[path] = bytes;
    }
    for (const auto& [key, slot] : counters_->class_bytes) {
      v1::OpsByteCount* count = stats->add_bytes_by_class();
      const size_t slash = key.find('/');
      count->set_path(key.substr(0, slash));
      count->set_priority(slash == std::string::npos ? "" : key.substr(slash + 1));
      count->set_bytes(slot->load(std::memory_order_relaxed));
    }
    for (const auto& [link, slot] : counters_->link_bytes) {
      (*stats->mutable_bytes_by_link())[link] = slot->load(std::memory_order_relaxed);
    }
    for (const auto& [code, n] : counters_->rejected_by_code) {
      (*stats->mutable_rejected_by_code())[code] = n;
    }
  }
  std::vector<uint64_t> queued(engine::kNumPriorityClasses, 0);
  for (const engine::Engine* e : engines_.engines()) {
    const std::vector<uint64_t> more = e->QueuedTiles();
    for (size_t c = 0; c < queued.size() && c < more.size(); ++c) queued[c] += more[c];
  }
  for (int c = 0; c < engine::kNumPriorityClasses; ++c) {
    (*stats->mutable_queued_tiles())[engine::PriorityClassName(
        static_cast<engine::PriorityClass>(c))] = queued[c];
  }
  for (const engine::Engine* e : engines_.engines()) stats->add_engines(e->Describe());
  std::vector<const engine::Engine*> shown(engines_.engines().begin(), engines_.engines().end());
  if (options_.remote != nullptr && options_.remote->engine() != nullptr) {
    shown.push_back(options_.remote->engine());
  }
  for (const engine::Engine* e : shown) {
    v1::OpsEngineState* state = stats->add_engine_states();
    state->set_name(e->name());
    state->set_description(e->Describe());
    for (const auto& [name, value] : e->Gauges()) (*state->mutable_gauges())[name] = value;
  }
  absl::MutexLock lock(&mu_);
  stats->set_draining(draining_);
}

}  // namespace kvrail::transfers
