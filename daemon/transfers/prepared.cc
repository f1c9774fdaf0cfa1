// Prepared transfers: Prepare (Resolve -> route -> PlanTemplate, once), Post (the ids, the
// regions and grants still holding -> PlanTemplate::Instantiate -> Admit) and their table.
#include "daemon/transfers/prepared.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "daemon/scheduler/route.h"
#include "daemon/transfers/manager_impl.h"
#include "spdlog/spdlog.h"

namespace kvrail::transfers {

namespace {

// One side's ids of a post (`side` "src" / "dst"), from whichever encoding it used; errors and
// the planner's messages name that field ("post.src_block_ids_le32[3]: ...").
absl::StatusOr<planner::TableRef> PostIds(const google::protobuf::RepeatedField<uint32_t>& ids,
                                          const std::string& le32, absl::string_view side) {
  if (le32.empty()) {
    return planner::TableRef{ids.data(), static_cast<size_t>(ids.size()),
                             absl::StrCat("post.", side, "_block_ids")};
  }
  const std::string field = absl::StrCat("post.", side, "_block_ids_le32");
  if (!ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": set ", side, "_block_ids or ", side, "_block_ids_le32, not both"));
  }
  if (le32.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", le32.size(), " bytes is not a whole number of uint32 ids"));
  }
  // x86-64 and aarch64 are little-endian; the planner copies the ids (any alignment).
  return planner::TableRef{reinterpret_cast<const uint32_t*>(le32.data()), le32.size() / 4, field};
}

}  // namespace

absl::Status UnknownPrepared(uint64_t id) {
  return absl::NotFoundError(absl::StrCat("prepared_id: no prepared transfer ", id));
}

absl::StatusOr<uint64_t> PreparedTable::Add(std::shared_ptr<const Prepared> prepared) {
  absl::MutexLock lock(&mu_);
  uint32_t& held = per_session_[prepared->session];
  if (held >= max_per_session_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_prepared_per_session: session ", prepared->session, " holds ", held,
        " prepared transfers, the most allowed (DaemonConfig.max_prepared_per_session); release "
        "some (ReleasePrepared)"));
  }
  ++held;
  const uint64_t id = next_id_++;
  by_id_.emplace(id, std::move(prepared));
  return id;
}

absl::StatusOr<std::shared_ptr<const Prepared>> PreparedTable::Find(uint64_t id,
                                                                    uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || session == 0 || it->second->session != session) {
    return UnknownPrepared(id);
  }
  return it->second;
}

absl::Status PreparedTable::Release(uint64_t id, uint64_t session) {
  std::shared_ptr<const Prepared> gone;  // destroyed outside mu_
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || session == 0 || it->second->session != session) {
    return UnknownPrepared(id);
  }
  gone = std::move(it->second);
  by_id_.erase(it);
  if (--per_session_[session] == 0) per_session_.erase(session);
  return absl::OkStatus();
}

template <typename Pred>
void PreparedTable::DropIf(Pred gone) {
  std::vector<std::shared_ptr<const Prepared>> dropped;  // destroyed outside mu_
  absl::MutexLock lock(&mu_);
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    if (!gone(*it->second)) {
      ++it;
      continue;
    }
    const uint64_t session = it->second->session;
    if (--per_session_[session] == 0) per_session_.erase(session);
    dropped.push_back(std::move(it->second));
    by_id_.erase(it++);
  }
}

void PreparedTable::EndSession(uint64_t session) {
  DropIf([session](const Prepared& p) {
    return p.session == session || p.src->session_id() == session || p.dst->session_id() == session;
  });
}

void PreparedTable::DropRegion(uint64_t region_id) {
  DropIf([region_id](const Prepared& p) {
    return p.src->id() == region_id || p.dst->id() == region_id;
  });
}

size_t PreparedTable::size() const {
  absl::MutexLock lock(&mu_);
  return by_id_.size();
}

size_t PreparedTable::held_by(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = per_session_.find(session);
  return it == per_session_.end() ? 0 : it->second;
}

absl::StatusOr<v1::PrepareTransferResponse> TransferManagerImpl::Prepare(
    const sessions::Caller& caller, const v1::PrepareTransferRequest& request) {
  if (caller.session_id == 0) {
    return absl::PermissionDeniedError(
        "session_id: a prepared transfer belongs to a session; prepare it with the session's "
        "kvrail-session credentials (the client library does)");
  }
  v1::TransferSpec spec = request.spec();
  spec.set_session_id(caller.session_id);  // the caller, whatever the spec claims
  if (!spec.idempotency_key().empty()) {
    return absl::InvalidArgumentError(
        "spec.idempotency_key: every post of a prepared transfer is a new transfer; prepare it "
        "without a key");
  }
  for (const auto& [set, field] : {std::pair{spec.has_ready_flags(), "spec.ready_flags"},
                                   std::pair{spec.has_arrival_flags(), "spec.arrival_flags"},
                                   std::pair{spec.has_done_word(), "spec.done_word"}}) {
    if (set) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": not supported in a prepared transfer's shape",
                       std::string_view(field) == "spec.done_word"
                           ? " (give each post its own: PostTransferRequest.done_word)"
                           : "; submit such transfers with SubmitTransfer"));
    }
  }
  for (const auto& [ep, field] : {std::pair{&spec.src(), "spec.src.block_ids"},
                                  std::pair{&spec.dst(), "spec.dst.block_ids"}}) {
    // Checked here: Resolve's spec for the planner (light) has no tables left to see.
    if (ep->block_ids_size() != 0 || !ep->block_ids_le32().empty() || ep->has_block_table()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": a prepared transfer's block ids come with each post; prepare it without ids"));
    }
  }
  KVRAIL_RETURN_IF_ERROR(CheckNotification(spec));
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("the daemon is draining; prepare elsewhere");
  }
  KVRAIL_ASSIGN_OR_RETURN(const ResolvedRequest resolved,
                          Resolve(spec, *regions_, *grants_,
                                  ResolveOptions{options_.node_id, options_.remote != nullptr}));
  if (resolved.remote) {
    return absl::UnimplementedError(absl::StrCat(
        "spec.dst.node_id: '", spec.dst().node_id(),
        "' is another node; prepared transfers stay within the node (use SubmitTransfer)"));
  }
  const job::Placement src_at = PlacementOf(*resolved.src), dst_at = PlacementOf(*resolved.dst);
  KVRAIL_ASSIGN_OR_RETURN(const Routed routed,
                          RouteAndEngine(src_at, dst_at, spec.digest(), "prepare"));
  const scheduler::Route& route = routed.route;
  engine::Engine* const engine = routed.engine;
  planner::PlanOptions plan_options;
  plan_options.tile_bytes = options_.tile_bytes;
  KVRAIL_ASSIGN_OR_RETURN(planner::PlanTemplate plan,
                          planner::PlanTemplate::Make(
                              resolved.light, resolved.src->view(), resolved.dst->view(),
                              plan_options, request.src_block_count(), request.dst_block_count()));
  auto prepared = std::make_shared<Prepared>(
      Prepared{caller.session_id, resolved.light, resolved.src, resolved.dst, resolved.priority,
               route.path, route.reason, engine, route.engine == scheduler::EngineKind::kCuda,
               LinkName(*resolved.src, *resolved.dst), std::move(plan), GrantUsesOf(resolved)});
  v1::PrepareTransferResponse response;
  response.set_bytes_total(prepared->plan.shape().bytes_total());
  response.set_tiles_total(prepared->plan.shape().num_tiles());
  response.set_src_block_count(prepared->plan.src_count());
  response.set_dst_block_count(prepared->plan.dst_count());
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t id, prepared_->Add(std::move(prepared)));
  response.set_prepared_id(id);
  KVRAIL_DEBUG("prepared transfer {} of session {}: {} bytes, {} tiles per post", id,
               caller.session_id, response.bytes_total(), response.tiles_total());
  return response;
}

absl::StatusOr<v1::SubmitTransferResponse> TransferManagerImpl::Post(
    const sessions::Caller& caller, const v1::PostTransferRequest& post) {
  absl::StatusOr<v1::SubmitTransferResponse> response = PostCounted(caller, post);
  if (!response.ok()) CountRejected(response.status());
  return response;
}

absl::StatusOr<v1::SubmitTransferResponse> TransferManagerImpl::PostCounted(
    const sessions::Caller& caller, const v1::PostTransferRequest& post) {
  const int64_t received_us = clock_->NowUnixMicros();
  KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<const Prepared> p,
                          prepared_->Find(post.prepared_id(), caller.session_id));
  // What may have changed since Prepare: the regions (unregistered, poisoned: the same answer as
  // a submit naming them) and the grants the shape uses.
  for (const auto& [held, field] :
       {std::pair{&p->src, "spec.src.region_id: "}, std::pair{&p->dst, "spec.dst.region_id: "}}) {
    absl::StatusOr<std::shared_ptr<regions::Region>> now = regions_->Get((*held)->id());
    if (!now.ok())
      return absl::Status(now.status().code(), absl::StrCat(field, now.status().message()));
    if (now->get() != held->get()) {
      return absl::NotFoundError(absl::StrCat(field, "region ", (*held)->id(), " was replaced"));
    }
  }
  for (const GrantUse& use : p->grant_uses) {
    KVRAIL_RETURN_IF_ERROR(grants_->CheckAccess(*use.region, use.session, use.grant, use.access,
                                                use.layer_begin, use.layer_end, use.field));
  }
  ResolvedDoneWord done;
  if (post.has_done_word()) {
    KVRAIL_ASSIGN_OR_RETURN(done, ResolveDoneWord(*regions_, post.done_word(), p->session));
  }
  KVRAIL_ASSIGN_OR_RETURN(InFlightSlot slot, TakeInFlight(p->session));
  planner::PlanOptions plan_options;
  plan_options.tile_bytes = options_.tile_bytes;
  plan_options.defer_checks_from = options_.defer_id_checks_from;
  plan_options.table_checks = table_checks_.get();
  plan_options.tables = engines_.TablePool();
  KVRAIL_ASSIGN_OR_RETURN(const planner::TableRef src_ids,
                          PostIds(post.src_block_ids(), post.src_block_ids_le32(), "src"));
  KVRAIL_ASSIGN_OR_RETURN(const planner::TableRef dst_ids,
                          PostIds(post.dst_block_ids(), post.dst_block_ids_le32(), "dst"));
  KVRAIL_ASSIGN_OR_RETURN(planner::Plan plan, p->plan.Instantiate(src_ids, dst_ids, plan_options));
  if (p->on_cuda) p->engine->Expect(PlacementOf(*p->src), PlacementOf(*p->dst));
  RecordParams params;
  params.spec = p->light;
  if (post.has_done_word()) *params.spec.mutable_done_word() = post.done_word();
  params.src = p->src;
  params.dst = p->dst;
  params.priority = p->priority;
  params.path = p->path;
  params.path_reason = p->path_reason;
  params.engine = p->engine;
  if (p->light.timeout_ms() > 0) {
    params.deadline = clock_->Now() + absl::Milliseconds(p->light.timeout_ms());
  }
  params.link = p->link;
  params.received_us = received_us;
  if (done.set()) params.done = done;
  if (p->light.layerwise()) params.readiness_session = p->session;
  Admission admission;
  admission.in_flight = &slot;
  admission.submitter_session = p->session;
  KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<Record> record,
                          Admit(std::move(plan), std::move(params), admission));
  std::vector<GrantUse> uses = p->grant_uses;
  grant_uses_->Add(record, std::move(uses));
  return Accepted(record->id(), record->plan(), false);
}

absl::Status TransferManagerImpl::ReleasePrepared(const sessions::Caller& caller,
                                                  uint64_t prepared_id) {
  return prepared_->Release(prepared_id, caller.session_id);
}

}  // namespace kvrail::transfers
