// Admission: Submit -> Resolve -> plan -> route -> Admit; deadlines and drain.
#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "daemon/scheduler/route.h"
#include "daemon/transfers/manager_impl.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "spdlog/spdlog.h"

namespace kvrail::transfers {
namespace {

std::shared_ptr<Counters> MakeCounters(std::function<void(const v1::TransferStatus&)> on_finished) {
  auto counters = std::make_shared<Counters>();
  counters->on_finished = std::move(on_finished);
  return counters;
}

absl::Status Draining() {
  return absl::UnavailableError("the daemon is draining; submit elsewhere");
}

}  // namespace

std::string LinkName(const regions::Region& src, const regions::Region& dst) {
  auto side = [](const regions::Region& r) {
    return r.spec().memory_kind() == v1::MEMORY_KIND_CUDA ? absl::StrCat("gpu", r.spec().device())
                                                          : std::string("host");
  };
  const std::string a = side(src), b = side(dst);
  return a == b ? a : absl::StrCat(a, "-", b);
}

job::Placement PlacementOf(const regions::Region& r) {
  return r.spec().memory_kind() == v1::MEMORY_KIND_CUDA ? job::Placement::Gpu(r.spec().device())
                                                        : job::Placement::Host();
}

namespace {

// What the first Submit would otherwise pay after its "submitted" stamp: its record's first
// v1::Path_Name (the counters' key) builds the generated descriptors of
// proto/kvrail/v1/transfer.proto and its imports, 350-450 us on the build machine
// (docs/benchmarks.md). Done once, when the manager is made at start.
void WarmFirstUse() {
  for (int p = v1::Path_MIN; p <= v1::Path_MAX; ++p) {
    if (v1::Path_IsValid(p)) (void)v1::Path_Name(static_cast<v1::Path>(p));
  }
  (void)v1::TransferState_Name(v1::TRANSFER_STATE_QUEUED);
  (void)v1::Priority_Name(v1::PRIORITY_CRITICAL);
}

}  // namespace

TransferManagerImpl::TransferManagerImpl(regions::RegionTable* regions, access::Grants* grants,
                                         EngineRegistry engines, Clock* clock,
                                         const Options& options)
    : regions_(regions),
      grants_(grants),
      engines_(std::move(engines)),
      clock_(clock),
      options_(options),
      counters_(MakeCounters(options.on_finished)),
      gpu_index_(scheduler::GpuIndexByOrdinal(options.topology)),
      table_checks_(planner::CreateParallelTableChecks()),
      next_id_(std::max<uint64_t>(1, static_cast<uint64_t>(clock->NowUnixMicros()))),
      history_(options.history),
      watches_(options.flag_poll_interval),
      grant_uses_(std::make_shared<GrantUses>(grants)),
      prepared_(std::make_shared<PreparedTable>(options.max_prepared_per_session)) {
  // A prepared transfer dies with its regions (and holds neither mapping after).
  regions_->AddUnregisterHook([prepared = std::weak_ptr<PreparedTable>(prepared_)](uint64_t id) {
    if (auto held = prepared.lock()) held->DropRegion(id);
  });
  grants_->AddAccessHook([uses = std::weak_ptr<GrantUses>(grant_uses_)] {
    if (auto held = uses.lock()) held->Recheck();
  });
  WarmFirstUse();
  deadline_thread_ = std::thread([this] { DeadlineLoop(); });
}

TransferManagerImpl::~TransferManagerImpl() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  deadline_thread_.join();
}

TransferManagerImpl::KeyClaim::~KeyClaim() {
  if (owner_ == nullptr || key_.empty()) return;
  absl::MutexLock lock(&owner_->mu_);
  owner_->history_.Unreserve(key_);  // a no-op once the transfer was admitted under the key
}

// The spec's identity for its idempotency key: a hash of its deterministic serialization (block
// tables included). Two submits of the same spec by the same session hash alike; the done word
// is left out (the client library gives every submit, a retry too, a word of its own).
static uint64_t SpecFingerprint(const v1::TransferSpec& given) {
  const v1::TransferSpec* spec = &given;
  v1::TransferSpec without_word;
  if (given.has_done_word()) {
    without_word = given;
    without_word.clear_done_word();
    spec = &without_word;
  }
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    spec->SerializeToCodedStream(&coded);
  }
  return absl::HashOf(bytes);
}

absl::StatusOr<TransferManagerImpl::Claimed> TransferManagerImpl::ClaimKey(
    const v1::TransferSpec& spec) {
  if (spec.idempotency_key().empty()) {
    absl::MutexLock lock(&mu_);
    if (draining_) return Draining();
    return Claimed{std::nullopt, KeyClaim(nullptr, std::string())};
  }
  // Keys are the caller's: another session's same key names another transfer.
  const std::string key = absl::StrCat(spec.session_id(), "/", spec.idempotency_key());
  const uint64_t fingerprint = SpecFingerprint(spec);
  absl::MutexLock lock(&mu_);
  if (draining_) return Draining();
  // A submit with this key in progress: wait for its outcome (mu_ is released meanwhile).
  auto settled = [this, &key]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !history_.Reserved(key); };
  mu_.Await(absl::Condition(&settled));
  uint64_t earlier_fingerprint = 0;
  if (std::shared_ptr<Record> earlier = history_.ByKey(key, &earlier_fingerprint)) {
    if (earlier_fingerprint != fingerprint) {
      return absl::AlreadyExistsError(absl::StrCat(
          "idempotency_key: '", spec.idempotency_key(), "' names this session's transfer ",
          earlier->id(), ", submitted with another spec; use a new key for a new transfer"));
    }
    return Claimed{Accepted(earlier->id(), earlier->plan(), true), KeyClaim(nullptr, key)};
  }
  history_.Reserve(key);
  return Claimed{std::nullopt, KeyClaim(this, key, fingerprint)};
}

void TransferManagerImpl::InFlightSlot::HandTo(Record& record) {
  std::shared_ptr<InFlight> counts = std::move(counts_);
  counts_.reset();
  // Runs once, on the thread ending the record (at once when it has ended): only a counter.
  const absl::Status kept = record.WhenEnded(
      [counts, session = session_](const v1::TransferStatus&) { counts->Give(session); },
      /*counted=*/false, StatusDetail::kEnd);
  if (!kept.ok()) counts->Give(session_);  // not reached: a new record has no waiters yet
}

absl::StatusOr<TransferManagerImpl::InFlightSlot> TransferManagerImpl::TakeInFlight(
    uint64_t session) {
  absl::MutexLock lock(&in_flight_->mu);
  uint32_t& n = in_flight_->by_session[session];
  if (n >= options_.max_transfers_per_session) {
    const uint32_t held = n;
    if (n == 0) in_flight_->by_session.erase(session);
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_transfers_per_session: ",
        session == 0 ? std::string("the anonymous callers have ")
                     : absl::StrCat("session ", session, " has "),
        held,
        " transfers in flight, the most allowed (DaemonConfig.max_transfers_per_session); "
        "wait for some to end"));
  }
  ++n;
  return InFlightSlot(in_flight_, session);
}

absl::StatusOr<v1::SubmitTransferResponse> TransferManagerImpl::Submit(
    const v1::TransferSpec& spec) {
  absl::StatusOr<v1::SubmitTransferResponse> response = SubmitCounted(spec);
  if (!response.ok()) CountRejected(response.status());
  return response;
}

void TransferManagerImpl::CountRejected(const absl::Status& status) {
  absl::MutexLock c(&counters_->mu);
  ++counters_->rejected_by_code[absl::StatusCodeToString(status.code())];
}

absl::StatusOr<v1::SubmitTransferResponse> TransferManagerImpl::SubmitCounted(
    const v1::TransferSpec& spec) {
  const int64_t received_us = clock_->NowUnixMicros();
  KVRAIL_RETURN_IF_ERROR(CheckNotification(spec));
  KVRAIL_ASSIGN_OR_RETURN(Claimed claimed, ClaimKey(spec));
  if (claimed.earlier.has_value()) return *claimed.earlier;
  KVRAIL_ASSIGN_OR_RETURN(InFlightSlot slot, TakeInFlight(spec.session_id()));
  KVRAIL_ASSIGN_OR_RETURN(const ResolvedRequest request,
                          Resolve(spec, *regions_, *grants_,
                                  ResolveOptions{options_.node_id, options_.remote != nullptr}));
  if (request.remote) return SubmitRemote(request, claimed.claim, &slot);
  return SubmitLocal(request, received_us, claimed.claim, &slot);
}

absl::StatusOr<v1::SubmitTransferResponse> TransferManagerImpl::SubmitWithinNode(
    const v1::TransferSpec& spec) {
  if (!spec.dst().node_id().empty() && spec.dst().node_id() != options_.node_id) {
    absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
        "spec.dst.node_id: '", spec.dst().node_id(),
        "' is another node; submit transfers between nodes with SubmitTransfer (gRPC)"));
    CountRejected(refused);
    return refused;
  }
  return Submit(spec);
}

absl::StatusOr<TransferManagerImpl::Routed> TransferManagerImpl::RouteAndEngine(
    const job::Placement& src_at, const job::Placement& dst_at, bool digest,
    absl::string_view verb) {
  KVRAIL_ASSIGN_OR_RETURN(const scheduler::Route route,
                          scheduler::ChooseRoute(src_at, dst_at, options_.topology_graph,
                                                 gpu_index_, engines_.MovesGpuMemory()));
  engine::Engine* engine = engines_.For(route.engine);
  if (engine == nullptr) {
    return absl::FailedPreconditionError(
        "spec.src.region_id: no engine of this daemon moves host memory between two regions");
  }
  if (digest && !engine->capabilities().digest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.digest: the ", engine->name(),
        " engine that would run this transfer does not hash tiles; ", verb, " it without digest"));
  }
  return Routed{route, engine};
}

absl::StatusOr<v1::SubmitTransferResponse> TransferManagerImpl::SubmitLocal(
    const ResolvedRequest& request, int64_t received_us, const KeyClaim& claim,
    InFlightSlot* slot) {
  const v1::TransferSpec& spec = *request.spec;
  planner::PlanOptions plan_options;
  plan_options.tile_bytes = options_.tile_bytes;
  plan_options.defer_checks_from = options_.defer_id_checks_from;
  plan_options.table_checks = table_checks_.get();
  plan_options.tables = engines_.TablePool();
  const job::Placement src_at = PlacementOf(*request.src), dst_at = PlacementOf(*request.dst);
  // The route needs no plan: chosen first, so a GPU's dispatcher asleep after an idle spell wakes
  // while the plan is made.
  KVRAIL_ASSIGN_OR_RETURN(const Routed routed,
                          RouteAndEngine(src_at, dst_at, spec.digest(), "submit"));
  const scheduler::Route& route = routed.route;
  engine::Engine* const engine = routed.engine;
  if (route.engine == scheduler::EngineKind::kCuda) {
    engine->Expect(src_at, dst_at);
  }
  KVRAIL_ASSIGN_OR_RETURN(planner::Plan plan,
                          planner::MakePlan(request.light, request.src->view(), request.dst->view(),
                                            plan_options, request.Tables()));
  KVRAIL_RETURN_IF_ERROR(request.ready.CheckFits(plan.num_layers()));
  KVRAIL_RETURN_IF_ERROR(request.arrival.CheckFits(plan.num_layers()));
  std::optional<absl::Time> deadline;
  if (spec.timeout_ms() > 0) {
    deadline = clock_->Now() + absl::Milliseconds(spec.timeout_ms());
    // Fail early rather than late: when the work queued ahead plus this transfer cannot finish in
    // time at the engine's measured rate, nothing is queued. (Layer-wise transfers wait for their
    // producer, whose pace the daemon cannot know; they are checked at their deadline.)
    const std::optional<double> eta =
        spec.layerwise() || spec.has_ready_flags()
            ? std::nullopt
            : engine->EstimateSeconds(plan.bytes_total(), request.priority);
    if (eta.has_value() && *eta * 1e3 > static_cast<double>(spec.timeout_ms())) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "spec.timeout_ms: %u ms cannot be met: moving %.1f MiB behind the work queued ahead "
          "needs about %.1f ms at this engine's measured rate",
          spec.timeout_ms(), plan.bytes_total() / 1048576.0, *eta * 1e3));
    }
  }
  RecordParams params;
  params.spec = request.light;
  params.src = request.src;
  params.dst = request.dst;
  params.priority = request.priority;
  params.path = route.path;
  params.path_reason = route.reason;
  params.engine = engine;
  params.deadline = deadline;
  params.link = LinkName(*request.src, *request.dst);
  params.received_us = received_us;
  if (request.arrival.set()) params.arrival = request.arrival;
  if (request.done.set()) params.done = request.done;
  // A layer-wise transfer waits for its producer: the owner of its ready flags, else the
  // submitter (MarkReady). EndSession ends it when that session ends.
  if (request.ready.set()) {
    params.readiness_session = request.ready.region->session_id();
    params.ready = request.ready;
  } else if (spec.layerwise()) {
    params.readiness_session = spec.session_id();
  }
  Admission admission;
  admission.claim = &claim;
  admission.in_flight = slot;
  admission.submitter_session = spec.session_id();
  admission.ready = &request.ready;
  admission.first_layer = spec.src().layer_begin();
  KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<Record> record,
                          Admit(std::move(plan), std::move(params), admission));
  grant_uses_->Add(record, GrantUsesOf(request));
  KVRAIL_DEBUG("transfer {} accepted: {} bytes, {} tiles, {}; {} via {} ({})", record->id(),
               record->plan().bytes_total(), record->plan().num_tiles(), record->plan().Describe(),
               v1::Path_Name(route.path), engine->name(), route.reason);
  return Accepted(record->id(), record->plan(), false);
}

// PATH_FABRIC: the destination is a region another node exported to this one. Planned against
// the lease, announced to the peer, then queued on the fabric engine.
absl::StatusOr<v1::SubmitTransferResponse> TransferManagerImpl::SubmitRemote(
    const ResolvedRequest& request, const KeyClaim& claim, InFlightSlot* slot) {
  const v1::TransferSpec& spec = *request.spec;
  // Host sources are packed into the staging slots by the host twin, GPU sources by the copy
  // engines (tile_copy.h).
  KVRAIL_ASSIGN_OR_RETURN(RemotePath::Prepared prepared, options_.remote->Prepare(request.light));
  planner::PlanOptions plan_options;
  plan_options.tile_bytes = std::min(options_.tile_bytes, prepared.max_tile_bytes);
  plan_options.table_checks = table_checks_.get();
  KVRAIL_ASSIGN_OR_RETURN(planner::Plan plan,
                          planner::MakePlan(request.light, request.src->view(),
                                            prepared.dst->view(), plan_options, request.Tables()));
  RecordParams params;
  params.spec = request.light;
  params.src = request.src;
  params.dst = prepared.dst;
  params.priority = request.priority;
  params.path = v1::PATH_FABRIC;
  params.path_reason = absl::StrCat("destination is on node '", spec.dst().node_id(), "'");
  params.engine = prepared.engine;
  if (spec.timeout_ms() > 0) {
    params.deadline = clock_->Now() + absl::Milliseconds(spec.timeout_ms());
  }
  params.link = FabricLinkName(options_.node_id, spec.dst().node_id());
  std::vector<std::string> nics;
  if (spec.layerwise()) params.readiness_session = spec.session_id();
  Admission admission;
  admission.claim = &claim;
  admission.in_flight = slot;
  admission.submitter_session = spec.session_id();
  admission.before_admit = [&](const std::shared_ptr<Record>& record) -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(nics,
                            options_.remote->Begin(record->id(), request.Traveling(), *request.src,
                                                   plan_options.tile_bytes, record));
    record->SetNics(nics);
    return absl::OkStatus();
  };
  KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<Record> record,
                          Admit(std::move(plan), std::move(params), admission));
  grant_uses_->Add(record, GrantUsesOf(request));
  KVRAIL_DEBUG("transfer {} accepted: {} bytes, {} tiles, {}; PATH_FABRIC to '{}' over {}",
               record->id(), record->plan().bytes_total(), record->plan().num_tiles(),
               record->plan().Describe(), spec.dst().node_id(), absl::StrJoin(nics, ","));
  return Accepted(record->id(), record->plan(), false);
}

absl::StatusOr<std::shared_ptr<Record>> TransferManagerImpl::Admit(planner::Plan plan,
                                                                   RecordParams params,
                                                                   const Admission& admission) {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return Draining();
    params.id = next_id_++;
  }
  params.counters = counters_;
  params.clock = clock_;
  // Regions on another node (a lease, a sender's source) have no owning session here.
  std::vector<NotificationRecipient> recipients;
  if (!params.spec.notification().empty()) {
    recipients =
        NotificationRecipients(params.src->id(), params.src->session_id(), params.dst->id(),
                               params.dst->session_id(), admission.submitter_session);
  }
  // The record (a copy of the spec) is built outside the manager's lock.
  auto record = std::make_shared<Record>(std::move(plan), std::move(params));
  const bool committed = admission.before_admit != nullptr;
  if (committed) KVRAIL_RETURN_IF_ERROR(admission.before_admit(record));
  {
    absl::MutexLock lock(&mu_);
    if (draining_ && !committed) return Draining();
    {
      absl::MutexLock c(&counters_->mu);
      ++counters_->submitted;
      ++counters_->active;
    }
    if (admission.claim != nullptr) {
      history_.Add(record, admission.claim->key(), admission.claim->fingerprint());
    } else {
      history_.Add(record, std::string());
    }
  }
  if (admission.in_flight != nullptr) admission.in_flight->HandTo(*record);
  NotifyWhenEnded(record, admission, std::move(recipients));
  // Outside mu_: the watch takes the watcher's lock, Enqueue the engine's.
  if (admission.ready != nullptr && admission.ready->set()) {
    // The GPU-side wait first (the CUDA engine with cuda_stream_wait decides): every
    // layer goes to the engine now and each waits for its word on the GPU. Otherwise (host
    // engine, flags not mappable, stream_wait_jobs exhausted, ...) the readiness poller.
    if (record->engine()->capabilities().gated_admission && record->engine()->AdmitGated(record)) {
      record->engine()->Enqueue(record, record->TakeGatedTiles());
      return record;
    }
    watches_.Add(record, admission.ready->region, admission.ready->words, admission.ready->value,
                 admission.first_layer);
  }
  // No lock is held here: a small host transfer may run to its end on this thread
  // (Engine::EnqueueAdmitted), sparing the wake-up of a worker.
  record->engine()->EnqueueAdmitted(record, record->TakeInitialTiles());
  return record;
}

v1::SubmitTransferResponse TransferManagerImpl::Accepted(uint64_t id, const planner::Plan& plan,
                                                         bool deduplicated) {
  v1::SubmitTransferResponse response;
  response.set_transfer_id(id);
  response.set_deduplicated(deduplicated);
  response.set_bytes_total(plan.bytes_total());
  response.set_tiles_total(plan.num_tiles());
  return response;
}

void TransferManagerImpl::NotifyWhenEnded(const std::shared_ptr<Record>& record,
                                          const Admission& admission,
                                          std::vector<NotificationRecipient> recipients) {
  if (options_.notifications == nullptr || recipients.empty()) return;
  v1::Notification base;
  base.set_submitter_node_id(admission.submitter_node.empty() ? options_.node_id
                                                              : admission.submitter_node);
  base.set_submitter_transfer_id(
      admission.submitter_transfer_id != 0 ? admission.submitter_transfer_id : record->id());
  // Runs under the record's lock on the thread ending it: Deliver only queues (never blocks).
  const absl::Status kept =
      record->WhenEnded([hub = options_.notifications, recipients = std::move(recipients),
                         base = std::move(base)](const v1::TransferStatus& status) {
        v1::Notification n = base;
        n.set_transfer_id(status.transfer_id());
        n.set_notification(status.spec().notification());
        n.set_state(status.state());
        n.set_error_code(status.error_code());
        n.set_error_message(status.error_message());
        n.set_finished_unix_us(status.finished_unix_us());
        for (const NotificationRecipient& r : recipients) {
          n.set_region_id(r.region_id);
          n.set_region_is_source(r.region_is_source);
          hub->Deliver(r.session_id, n);
        }
      });
  if (!kept.ok()) spdlog::warn("transfer {}: notification lost: {}", record->id(), kept.ToString());
}

void TransferManagerImpl::End(const std::shared_ptr<Record>& record, const absl::Status& why) {
  if (record->IsFinal()) return;
  const size_t removed = record->engine()->Remove(record.get());
  if (record->RequestEnd(why, removed)) {
    spdlog::info("transfer {} ending: {}", record->id(), why.ToString());
  }
}

absl::Status UnknownTransfer(uint64_t id) {
  return absl::NotFoundError(absl::StrCat("transfer_id: no transfer ", id));
}

absl::StatusOr<std::shared_ptr<Record>> TransferManagerImpl::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Record> record = history_.Find(id);
  if (record == nullptr) return UnknownTransfer(id);
  return record;
}

uint64_t TransferManagerImpl::ActiveCount() const {
  absl::MutexLock c(&counters_->mu);
  return counters_->active;
}

void TransferManagerImpl::CheckDeadlines() {
  const absl::Time now = clock_->Now();
  std::vector<std::shared_ptr<Record>> late;
  {
    absl::MutexLock lock(&mu_);
    late = history_.Late(now);
  }
  for (const auto& record : late) {
    End(record, absl::DeadlineExceededError("the transfer's deadline (spec.timeout_ms) passed"));
  }
  grant_uses_->Expire(absl::ToUnixMicros(now));
}

void TransferManagerImpl::Drain(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
  }
  // Started transfers finish one after another instead of all advancing in step (which, with
  // more work queued than the timeout allows, fails every one of them).
  for (engine::Engine* e : engines_.engines()) e->FinishStartedFirst();
  // Measured by the injected clock; the real-time slices only pace the polling.
  const absl::Time until = clock_->Now() + timeout;
  while (clock_->Now() < until && ActiveCount() > 0) absl::SleepFor(absl::Milliseconds(5));
  std::vector<std::shared_ptr<Record>> open;
  {
    absl::MutexLock lock(&mu_);
    open = history_.Open();
  }
  for (const auto& record : open) {
    End(record, absl::UnavailableError("the daemon shut down before the transfer finished"));
  }
  // Running tiles report soon; wait for them so nothing writes after we return. (Inbound records
  // end at once: their unlanded tiles are dropped, and tiles landing later are ignored.)
  for (const auto& record : open) {
    while (!record->IsFinal()) record->AwaitChange(record->version(), absl::Milliseconds(50));
  }
}

void TransferManagerImpl::EndSession(uint64_t session_id) {
  if (session_id == 0) return;
  prepared_->EndSession(session_id);  // its prepared transfers, and those using its regions
  std::vector<std::shared_ptr<Record>> open;
  {
    absl::MutexLock lock(&mu_);
    open = history_.Open();
  }
  for (const auto& record : open) {
    // Memory of the ended session: its process is gone (or let go of the region), so nothing
    // more is written into it, whoever submitted the transfer (a pull whose decode died must
    // not land in the dead process's pool when the prefill marks its layers). Its source: a
    // transfer still waiting for layers of it ends (nobody vouches for them any more); one whose
    // bytes were all ready finishes (a producer may exit once it has marked its last layer).
    // Queued tiles are taken off the engine here; a tile already running finishes first.
    const bool writes = record->WritesRegionOf(session_id);
    if (writes || (record->src_owner_session() == session_id && record->AwaitsLayers())) {
      record->MarkProducerGone();
      End(record, absl::AbortedError(absl::StrCat(
                      "the session owning the transfer's ", writes ? "destination" : "source",
                      " region (session ", session_id, ") ended",
                      writes ? ": its memory is gone, so nothing more moves"
                             : " before every layer was ready")));
      continue;
    }
    if (!record->WaitsOn(session_id)) continue;
    record->MarkProducerGone();  // a gated record's GPU waits are released at once
    End(record, absl::AbortedError(absl::StrCat(
                    "the session that makes this transfer's layers ready (session ", session_id,
                    ": MarkReady or spec.ready_flags) ended before every layer was ready")));
  }
}

void TransferManagerImpl::PeerLost(const std::string& node_id, const absl::Status& why) {
  std::vector<std::shared_ptr<Record>> open;
  {
    absl::MutexLock lock(&mu_);
    open = history_.Open();
  }
  for (const auto& record : open) {
    // Outbound fabric transfers to that node (inbound ones end through EndInbound).
    if (record->inbound() || record->spec_dst_node() != node_id || node_id.empty()) continue;
    End(record, why);
  }
}

void TransferManagerImpl::DeadlineLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(5));
    if (stopping_) break;
    mu_.Unlock();
    CheckDeadlines();
    watches_.Sweep();
    mu_.Lock();
  }
}

std::unique_ptr<TransferManager> TransferManager::Create(regions::RegionTable* regions,
                                                         access::Grants* grants,
                                                         EngineRegistry engines, Clock* clock,
                                                         const Options& options) {
  return std::make_unique<TransferManagerImpl>(regions, grants, std::move(engines), clock, options);
}

}  // namespace kvrail::transfers
