#include <deque>
#include <list>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "daemon/readiness/readiness.h"
#include "daemon/scheduler/route.h"
#include "daemon/transfers/record.h"
#include "daemon/transfers/transfers.h"
#include "proto/kvrail/v1/spec_copy.h"
#include "spdlog/spdlog.h"

namespace kvrail::transfers {
namespace {

engine::PriorityClass ToClass(v1::Priority p) {
  switch (p) {
    case v1::PRIORITY_CRITICAL: return engine::PriorityClass::kCritical;
    case v1::PRIORITY_BACKGROUND: return engine::PriorityClass::kBackground;
    default: return engine::PriorityClass::kNormal;
  }
}

absl::Status CheckLocalNode(const v1::TransferEndpoint& ep, const std::string& node_id,
                            const char* field) {
  if (!ep.node_id().empty() && ep.node_id() != node_id) {
    return absl::UnimplementedError(absl::StrCat(
        field, ".node_id: '", ep.node_id(), "' is another node; this daemon (node '", node_id,
        "') has no fabric path configured"));
  }
  return absl::OkStatus();
}

std::shared_ptr<Counters> MakeCounters(std::function<void(const v1::TransferStatus&)> on_finished) {
  auto counters = std::make_shared<Counters>();
  counters->on_finished = std::move(on_finished);
  return counters;
}

// Resolves a FlagArray of `layers` words to its region and host address; errors name `field`.
absl::StatusOr<std::pair<std::shared_ptr<regions::Region>, uint32_t*>> ResolveFlags(
    const v1::FlagArray& flags, uint32_t layers, bool writable, regions::RegionTable* regions,
    const std::string& field) {
  auto region = regions->Get(flags.region_id());
  if (!region.ok()) {
    return absl::NotFoundError(absl::StrCat(field, ".region_id: ", region.status().message()));
  }
  if ((*region)->spec().memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ".region_id: flag words must be in host memory"));
  }
  if (writable && !(*region)->spec().writable()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ".region_id: the daemon writes arrival flags; the region is not writable"));
  }
  if (flags.byte_offset() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".byte_offset: must be a multiple of 4"));
  }
  if (flags.value() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".value: must not be 0"));
  }
  const uint64_t size = (*region)->spec().size_bytes();
  if (flags.byte_offset() > size || (size - flags.byte_offset()) / 4 < layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".byte_offset: ", layers, " flag words at byte ", flags.byte_offset(),
        " do not fit the region's ", size, " bytes"));
  }
  auto* words = reinterpret_cast<uint32_t*>((*region)->data() + flags.byte_offset());
  return std::make_pair(*std::move(region), words);
}

// A block table in a client's host region (TransferEndpoint.block_table), checked against the
// region's bounds; `region` keeps the memory mapped while the ids are read. Errors name
// `side`.block_table.
struct SharedTable {
  std::shared_ptr<regions::Region> region;
  const uint32_t* ids = nullptr;
  size_t count = 0;
};

absl::StatusOr<SharedTable> FindBlockTable(const regions::RegionTable& regions,
                                           const v1::TransferEndpoint& ep, const std::string& side) {
  const std::string field = absl::StrCat(side, ".block_table");
  if (ep.block_ids_size() > 0 || !ep.block_ids_le32().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": set one of block_ids, block_ids_le32 and block_table"));
  }
  const v1::BlockTableRef& table = ep.block_table();
  auto region = regions.Get(table.region_id());
  if (!region.ok()) {
    return absl::NotFoundError(absl::StrCat(field, ".region_id: ", region.status().message()));
  }
  if ((*region)->spec().memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".region_id: region ", table.region_id(),
        " is GPU memory; block tables are read from host memory"));
  }
  const uint64_t size = (*region)->spec().size_bytes();
  const uint64_t bytes = uint64_t{4} * table.count();
  if (table.offset_bytes() > size || size - table.offset_bytes() < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".count: ", table.count(), " ids at byte ", table.offset_bytes(),
        " do not fit the region's ", size, " bytes"));
  }
  const std::string& named_as = table.named_as();
  if (!named_as.empty() && named_as != "block_table" && named_as != "block_ids" &&
      named_as != "block_ids_le32") {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".named_as: '", named_as, "' is not block_table, block_ids or block_ids_le32"));
  }
  SharedTable out;
  out.ids = reinterpret_cast<const uint32_t*>((*region)->data() + table.offset_bytes());
  out.count = table.count();
  out.region = *std::move(region);
  return out;
}

// The field errors about a shared table's ids name (BlockTableRef.named_as, checked by
// FindBlockTable).
std::string TableFieldName(const v1::BlockTableRef& table) {
  return table.named_as().empty() ? "block_table" : table.named_as();
}

// Replaces ep.block_table with the ids it holds, as block_ids_le32 (for a transfer to another
// node, whose spec travels on with its tables).
absl::Status ResolveBlockTable(const regions::RegionTable& regions, v1::TransferEndpoint* ep,
                               const std::string& side) {
  if (!ep->has_block_table()) return absl::OkStatus();
  KVRAIL_ASSIGN_OR_RETURN(SharedTable table, FindBlockTable(regions, *ep, side));
  ep->set_block_ids_le32(std::string(reinterpret_cast<const char*>(table.ids), 4 * table.count));
  ep->clear_block_table();
  return absl::OkStatus();
}

// TransferStatus.link for a local transfer: "host", "gpu0", "gpu0-gpu1", "gpu0-host", ...
std::string LinkName(const regions::Region& src, const regions::Region& dst) {
  auto side = [](const regions::Region& r) {
    return r.spec().memory_kind() == v1::MEMORY_KIND_CUDA ? absl::StrCat("gpu", r.spec().device())
                                                          : std::string("host");
  };
  const std::string a = side(src), b = side(dst);
  return a == b ? a : absl::StrCat(a, "-", b);
}

// The "engine" of inbound fabric transfers: their tiles are written by the fabric's unpack
// threads, which report them to the record directly; nothing is queued here. Every tile that has
// not landed is in effect queued at the sender, so removing a job (ending it here) drops those:
// they will not be reported any more. Only Records are ever given to it. Thread-safe.
class InboundEngine final : public engine::Engine {
 public:
  std::string name() const override { return "fabric-receiver"; }
  void Enqueue(const std::shared_ptr<engine::Job>&, const std::vector<uint32_t>&) override {}
  size_t Remove(const engine::Job* job) override {
    return static_cast<const Record*>(job)->TilesUnreported();
  }
  std::vector<uint64_t> QueuedTiles() const override {
    return std::vector<uint64_t>(engine::kNumPriorityClasses, 0);
  }
  std::string Describe() const override { return "fabric-receiver"; }
};

class TransferManagerImpl final : public TransferManager {
 public:
  TransferManagerImpl(regions::RegionTable* regions, engine::Engine* engine, Clock* clock,
                      const Options& options)
      : regions_(regions),
        engine_(engine),
        clock_(clock),
        options_(options),
        counters_(MakeCounters(options.on_finished)),
        gpu_index_(scheduler::GpuIndexByOrdinal(options.topology)),
        next_id_(static_cast<uint64_t>(clock->NowUnixMicros())),
        watcher_(readiness::FlagWatcher::Create(options.flag_poll_interval)) {
    deadline_thread_ = std::thread([this] { DeadlineLoop(); });
  }

  ~TransferManagerImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    deadline_thread_.join();
  }

  absl::StatusOr<v1::SubmitTransferResponse> Submit(const v1::TransferSpec& request) override {
    const int64_t received_us = clock_->NowUnixMicros();
    if (!request.src().has_block_table() && !request.dst().has_block_table()) {
      return SubmitResolved(request, received_us, {});
    }
    if (IsRemote(request)) {
      // The spec travels on to the peer: its tables go in the message, copied once here.
      v1::TransferSpec resolved = request;
      KVRAIL_RETURN_IF_ERROR(ResolveBlockTable(*regions_, resolved.mutable_src(), "spec.src"));
      KVRAIL_RETURN_IF_ERROR(ResolveBlockTable(*regions_, resolved.mutable_dst(), "spec.dst"));
      absl::StatusOr<v1::SubmitTransferResponse> response =
          SubmitResolved(resolved, received_us, {});
      if (response.ok()) return response;
      // The planner names block_ids_le32; the client wrote block_table (or names another field).
      std::string message(response.status().message());
      for (const auto& [ep, side] : {std::pair{&request.src(), "spec.src"},
                                     std::pair{&request.dst(), "spec.dst"}}) {
        if (!ep->has_block_table()) continue;
        message = v1::RenameField(message, absl::StrCat(side, ".block_ids_le32"),
                                  absl::StrCat(side, ".", TableFieldName(ep->block_table())));
      }
      return absl::Status(response.status().code(), message);
    }
    // A local transfer: the planner reads the tables in place (one copy, into the plan).
    std::vector<SharedTable> held;
    planner::TableRefs refs;
    for (const auto& [ep, side, ref] : {std::tuple{&request.src(), "src", &refs.src},
                                        std::tuple{&request.dst(), "dst", &refs.dst}}) {
      if (!ep->has_block_table()) continue;
      KVRAIL_ASSIGN_OR_RETURN(SharedTable table,
                       FindBlockTable(*regions_, *ep, absl::StrCat("spec.", side)));
      *ref = planner::TableRef{table.ids, table.count,
                               absl::StrCat(side, ".", TableFieldName(ep->block_table()))};
      held.push_back(std::move(table));
    }
    return SubmitResolved(request, received_us, refs);
  }

  absl::StatusOr<v1::SubmitTransferResponse> SubmitWithinNode(
      const v1::TransferSpec& spec) override {
    if (ToOtherNode(spec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spec.dst.node_id: '", spec.dst().node_id(),
          "' is another node; submit transfers between nodes with SubmitTransfer (gRPC)"));
    }
    return Submit(spec);
  }

  bool ToOtherNode(const v1::TransferSpec& spec) const {
    return !spec.dst().node_id().empty() && spec.dst().node_id() != options_.node_id;
  }

  // A transfer this daemon sends over the fabric.
  bool IsRemote(const v1::TransferSpec& spec) const {
    return options_.remote != nullptr && ToOtherNode(spec);
  }

  // `tables`: block tables read in place (Submit); empty when the spec carries its own.
  absl::StatusOr<v1::SubmitTransferResponse> SubmitResolved(const v1::TransferSpec& spec,
                                                             int64_t received_us,
                                                             const planner::TableRefs& tables) {
    {
      absl::MutexLock lock(&mu_);
      if (draining_) return absl::UnavailableError("the daemon is draining; submit elsewhere");
      if (auto earlier = DuplicateLocked(spec.idempotency_key())) return *earlier;
    }
    if (!v1::Priority_IsValid(spec.priority())) {
      return absl::InvalidArgumentError(absl::StrCat("spec.priority: unknown value ", spec.priority()));
    }
    KVRAIL_RETURN_IF_ERROR(CheckLocalNode(spec.src(), options_.node_id, "spec.src"));
    if (IsRemote(spec)) return SubmitRemote(spec);
    KVRAIL_RETURN_IF_ERROR(CheckLocalNode(spec.dst(), options_.node_id, "spec.dst"));
    auto src = regions_->Get(spec.src().region_id());
    if (!src.ok()) {
      return absl::NotFoundError(absl::StrCat("spec.src.region_id: ", src.status().message()));
    }
    auto dst = regions_->Get(spec.dst().region_id());
    if (!dst.ok()) {
      return absl::NotFoundError(absl::StrCat("spec.dst.region_id: ", dst.status().message()));
    }
    planner::PlanOptions plan_options;
    plan_options.tile_bytes = options_.tile_bytes;
    plan_options.defer_checks_from = options_.defer_id_checks_from;
    // Any local plan may run on the CUDA engine (the route is chosen below): its tables go
    // where that engine uploads them from without staging.
    if (options_.cuda_engine != nullptr) plan_options.tables = options_.cuda_engine->table_pool();
    KVRAIL_ASSIGN_OR_RETURN(planner::Plan plan,
                     planner::MakePlan(spec, (*src)->view(), (*dst)->view(), plan_options, tables));
    auto placement = [](const regions::Region& r) {
      const bool cuda = r.spec().memory_kind() == v1::MEMORY_KIND_CUDA;
      return scheduler::Placement{cuda, cuda ? r.spec().device() : -1};
    };
    KVRAIL_ASSIGN_OR_RETURN(scheduler::Route route,
                     scheduler::ChooseRoute(placement(**src), placement(**dst),
                                            options_.topology_graph, gpu_index_,
                                            options_.cuda_engine != nullptr));
    engine::Engine* engine =
        route.engine == scheduler::EngineKind::kCuda ? options_.cuda_engine : engine_;
    std::pair<std::shared_ptr<regions::Region>, uint32_t*> ready{nullptr, nullptr};
    std::pair<std::shared_ptr<regions::Region>, uint32_t*> arrival{nullptr, nullptr};
    if (spec.has_ready_flags()) {
      KVRAIL_ASSIGN_OR_RETURN(ready, ResolveFlags(spec.ready_flags(), plan.num_layers(), false, regions_,
                                           "spec.ready_flags"));
    }
    if (spec.has_arrival_flags()) {
      KVRAIL_ASSIGN_OR_RETURN(arrival, ResolveFlags(spec.arrival_flags(), plan.num_layers(), true,
                                             regions_, "spec.arrival_flags"));
    }
    std::optional<absl::Time> deadline;
    if (spec.timeout_ms() > 0) {
      deadline = clock_->Now() + absl::Milliseconds(spec.timeout_ms());
      // Fail early rather than late: when the work queued ahead plus this transfer cannot finish
      // in time at the engine's measured rate, nothing is queued. (Layer-wise transfers wait for
      // their producer, whose pace the daemon cannot know; they are checked at their deadline.)
      const std::optional<double> eta =
          spec.layerwise() || spec.has_ready_flags()
              ? std::nullopt
              : engine->EstimateSeconds(plan.bytes_total(), ToClass(spec.priority()));
      if (eta.has_value() && *eta * 1e3 > static_cast<double>(spec.timeout_ms())) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "spec.timeout_ms: %u ms cannot be met: moving %.1f MiB behind the work queued ahead "
            "needs about %.1f ms at this engine's measured rate",
            spec.timeout_ms(), plan.bytes_total() / 1048576.0, *eta * 1e3));
      }
    }

    KVRAIL_ASSIGN_OR_RETURN(const uint64_t id, NextId());
    // The record (a copy of the spec) is built outside the manager's lock.
    auto record = std::make_shared<Record>(
        id, spec, *src, *dst, std::move(plan), ToClass(spec.priority()), route.path, route.reason,
        engine, deadline, counters_, clock_);
    record->SetLink(LinkName(**src, **dst));
    record->SetReceived(received_us);
    if (arrival.first != nullptr) {
      record->SetArrivalFlags(std::move(arrival.first), arrival.second, spec.arrival_flags().value());
    }
    {
      absl::MutexLock lock(&mu_);
      if (draining_) return absl::UnavailableError("the daemon is draining; submit elsewhere");
      // A concurrent submit with the same key won the race: answer with its transfer.
      if (auto earlier = DuplicateLocked(spec.idempotency_key())) return *earlier;
      AdmitLocked(record, spec);
      if (ready.first != nullptr) {
        WatchReadyFlags(record, std::move(ready), spec.ready_flags().value(),
                        spec.src().layer_begin());
      }
    }
    engine->Enqueue(record, record->TakeInitialTiles());
    spdlog::info("transfer {} accepted: {} bytes, {} tiles, {}; {} via {} ({})", id,
                 record->plan().bytes_total(), record->plan().num_tiles(),
                 record->plan().Describe(), v1::Path_Name(route.path), engine->name(),
                 route.reason);
    return Accepted(id, record->plan(), false);
  }

  absl::StatusOr<v1::TransferStatus> Get(uint64_t id) const override {
    KVRAIL_ASSIGN_OR_RETURN(auto record, Find(id));
    return record->Status();
  }

  absl::StatusOr<v1::TransferStatus> Wait(uint64_t id, absl::Duration timeout) const override {
    KVRAIL_ASSIGN_OR_RETURN(auto record, Find(id));
    const absl::Time until = absl::Now() + timeout;
    while (!record->IsFinal()) {
      const absl::Duration left = until - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      record->AwaitChange(record->version(), std::min(left, absl::Milliseconds(200)));
    }
    return record->Status();
  }

  absl::Status WhenEnded(uint64_t id,
                         std::function<void(const v1::TransferStatus&)> done) const override {
    KVRAIL_ASSIGN_OR_RETURN(auto record, Find(id));
    return record->WhenEnded(std::move(done));
  }

  absl::Status Watch(uint64_t id, absl::Duration min_interval,
                     const std::function<bool(const v1::TransferEvent&)>& sink) const override {
    KVRAIL_ASSIGN_OR_RETURN(auto record, Find(id));
    uint64_t seen = record->version();
    v1::TransferEvent event;
    event.set_kind(v1::TransferEvent::KIND_SNAPSHOT);
    *event.mutable_status() = record->Status();
    v1::TransferState last_state = event.status().state();
    uint64_t last_bytes = event.status().bytes_done();
    size_t layers_sent = record->LayersDone().size();
    absl::Time last_progress = absl::Now();
    if (!sink(event)) return absl::OkStatus();
    while (last_state < v1::TRANSFER_STATE_SUCCEEDED) {
      record->AwaitChange(seen, absl::Milliseconds(100));
      seen = record->version();
      v1::TransferStatus status = record->Status();
      const std::vector<uint32_t> layers = record->LayersDone();
      for (; layers_sent < layers.size(); ++layers_sent) {
        v1::TransferEvent layer_event;
        layer_event.set_kind(v1::TransferEvent::KIND_LAYER_DONE);
        layer_event.set_layer(status.spec().src().layer_begin() + layers[layers_sent]);
        *layer_event.mutable_status() = status;
        if (!sink(layer_event)) return absl::OkStatus();
      }
      v1::TransferEvent next;
      *next.mutable_status() = status;
      if (status.state() != last_state) {
        next.set_kind(v1::TransferEvent::KIND_STATE);
        last_state = status.state();
      } else if (status.bytes_done() != last_bytes && absl::Now() - last_progress >= min_interval) {
        next.set_kind(v1::TransferEvent::KIND_PROGRESS);
      } else {
        continue;
      }
      last_bytes = status.bytes_done();
      last_progress = absl::Now();
      if (!sink(next)) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<v1::TransferStatus> Cancel(uint64_t id) override {
    KVRAIL_ASSIGN_OR_RETURN(auto record, Find(id));
    if (record->inbound() && !record->IsFinal()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "transfer_id: transfer ", id, " is written into this node by another (",
          record->Status().path_reason(), "); cancel it on the sending node"));
    }
    End(record, absl::CancelledError("cancelled by a client"));
    return record->Status();
  }

  absl::Status MarkReady(uint64_t id, uint32_t layer_begin, uint32_t layer_count) override {
    KVRAIL_ASSIGN_OR_RETURN(auto record, Find(id));
    KVRAIL_ASSIGN_OR_RETURN(std::vector<uint32_t> tiles,
                     record->MarkReady(layer_begin, layer_count == 0 ? 1 : layer_count));
    record->engine()->Enqueue(record, tiles);
    return absl::OkStatus();
  }

  std::vector<v1::TransferStatus> List(const std::vector<v1::TransferState>& states,
                                       uint32_t limit) const override {
    if (limit == 0) limit = 100;
    std::vector<std::shared_ptr<Record>> newest;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
        auto rec = records_.find(*it);
        if (rec != records_.end()) newest.push_back(rec->second);
      }
    }
    std::vector<v1::TransferStatus> out;
    for (const auto& record : newest) {
      if (out.size() >= limit) break;
      v1::TransferStatus status = record->Status();
      if (!states.empty() &&
          std::find(states.begin(), states.end(), status.state()) == states.end()) {
        continue;
      }
      out.push_back(std::move(status));
    }
    return out;
  }

  void FillStats(v1::Stats* stats) const override {
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
    }
    std::vector<uint64_t> queued = engine_->QueuedTiles();
    if (options_.cuda_engine != nullptr) {
      const std::vector<uint64_t> cuda = options_.cuda_engine->QueuedTiles();
      for (size_t c = 0; c < queued.size() && c < cuda.size(); ++c) queued[c] += cuda[c];
    }
    for (int c = 0; c < engine::kNumPriorityClasses; ++c) {
      (*stats->mutable_queued_tiles())[engine::PriorityClassName(
          static_cast<engine::PriorityClass>(c))] = queued[c];
    }
    stats->add_engines(engine_->Describe());
    if (options_.cuda_engine != nullptr) stats->add_engines(options_.cuda_engine->Describe());
    absl::MutexLock lock(&mu_);
    stats->set_draining(draining_);
  }

  void CheckDeadlines() override {
    const absl::Time now = clock_->Now();
    std::vector<std::shared_ptr<Record>> late;
    {
      // Only transfers with a deadline that have not ended are looked at (not the whole history).
      absl::MutexLock lock(&mu_);
      for (auto it = with_deadline_.begin(); it != with_deadline_.end();) {
        std::shared_ptr<Record> record = it->lock();
        if (record == nullptr || record->IsFinal()) {
          it = with_deadline_.erase(it);
        } else {
          if (*record->deadline() <= now) late.push_back(std::move(record));
          ++it;
        }
      }
    }
    for (const auto& record : late) {
      End(record, absl::DeadlineExceededError("the transfer's deadline (spec.timeout_ms) passed"));
    }
  }

  void Drain(absl::Duration timeout) override {
    {
      absl::MutexLock lock(&mu_);
      draining_ = true;
    }
    const absl::Time until = absl::Now() + timeout;
    while (absl::Now() < until && ActiveCount() > 0) absl::SleepFor(absl::Milliseconds(5));
    std::vector<std::shared_ptr<Record>> open = Open();
    for (const auto& record : open) {
      End(record, absl::UnavailableError("the daemon shut down before the transfer finished"));
    }
    // Running tiles report soon; wait for them so nothing writes after we return.
    for (const auto& record : open) {
      while (!record->IsFinal()) record->AwaitChange(record->version(), absl::Milliseconds(50));
    }
  }

 private:
  // PATH_FABRIC: the destination is a region another node exported to this one. Validated and
  // planned against the lease, announced to the peer, then queued on the fabric engine.
  absl::StatusOr<v1::SubmitTransferResponse> SubmitRemote(const v1::TransferSpec& spec) {
    auto src = regions_->Get(spec.src().region_id());
    if (!src.ok()) {
      return absl::NotFoundError(absl::StrCat("spec.src.region_id: ", src.status().message()));
    }
    // Host sources are packed into the staging slots by the host twin, GPU sources by the copy
    // engines (tile_copy.h).
    KVRAIL_ASSIGN_OR_RETURN(RemotePath::Prepared prepared, options_.remote->Prepare(spec));
    planner::PlanOptions plan_options;
    plan_options.tile_bytes = std::min(options_.tile_bytes, prepared.max_tile_bytes);
    KVRAIL_ASSIGN_OR_RETURN(planner::Plan plan, planner::MakePlan(spec, (*src)->view(),
                                                           prepared.dst->view(), plan_options));
    std::optional<absl::Time> deadline;
    if (spec.timeout_ms() > 0) deadline = clock_->Now() + absl::Milliseconds(spec.timeout_ms());
    KVRAIL_ASSIGN_OR_RETURN(const uint64_t id, NextId());
    auto record = std::make_shared<Record>(
        id, spec, *src, prepared.dst, std::move(plan), ToClass(spec.priority()), v1::PATH_FABRIC,
        absl::StrCat("destination is on node '", spec.dst().node_id(), "'"), prepared.engine,
        deadline, counters_, clock_);
    KVRAIL_ASSIGN_OR_RETURN(std::vector<std::string> nics,
                     options_.remote->Begin(id, spec, **src, plan_options.tile_bytes, record));
    record->SetNics(nics);
    record->SetLink("fabric");
    {
      // The peer already expects this transfer: it is admitted even if a drain began meanwhile
      // (the drain then ends it like any other).
      absl::MutexLock lock(&mu_);
      AdmitLocked(record, spec);
    }
    prepared.engine->Enqueue(record, record->TakeInitialTiles());
    spdlog::info("transfer {} accepted: {} bytes, {} tiles, {}; PATH_FABRIC to '{}' over {}", id,
                 record->plan().bytes_total(), record->plan().num_tiles(),
                 record->plan().Describe(), spec.dst().node_id(), absl::StrJoin(nics, ","));
    return Accepted(id, record->plan(), false);
  }

  static v1::SubmitTransferResponse Accepted(uint64_t id, const planner::Plan& plan,
                                             bool deduplicated) {
    v1::SubmitTransferResponse response;
    response.set_transfer_id(id);
    response.set_deduplicated(deduplicated);
    response.set_bytes_total(plan.bytes_total());
    response.set_tiles_total(plan.num_tiles());
    return response;
  }

  // The answer for an earlier transfer with the same non-empty idempotency key, while it is in
  // the history.
  std::optional<v1::SubmitTransferResponse> DuplicateLocked(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (key.empty()) return std::nullopt;
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return std::nullopt;
    auto rec = records_.find(it->second);
    if (rec == records_.end()) return std::nullopt;
    return Accepted(it->second, rec->second->plan(), true);
  }

  // A fresh transfer id, unless the daemon is draining.
  absl::StatusOr<uint64_t> NextId() {
    absl::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("the daemon is draining; submit elsewhere");
    return next_id_++;
  }

  // Counts an accepted record and puts it in the history (and the deadline and idempotency
  // indexes). Its tiles are queued by the caller afterwards.
  void AdmitLocked(const std::shared_ptr<Record>& record, const v1::TransferSpec& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    {
      absl::MutexLock c(&counters_->mu);
      ++counters_->submitted;
      ++counters_->active;
    }
    records_[record->id()] = record;
    if (record->deadline().has_value()) with_deadline_.push_back(record);
    order_.push_back(record->id());
    if (!spec.idempotency_key().empty()) by_key_[spec.idempotency_key()] = record->id();
    TrimHistoryLocked();
  }

  // Releases layer i when ready word i reaches `value`. The callback holds only a weak
  // reference; the watch is dropped by SweepWatches once the transfer has ended.
  void WatchReadyFlags(const std::shared_ptr<Record>& record,
                       std::pair<std::shared_ptr<regions::Region>, uint32_t*> ready, uint32_t value,
                       uint32_t first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::weak_ptr<Record> weak = record;
    auto handle = watcher_->Watch(ready.second, record->plan().num_layers(), value,
                                  [weak, first](uint32_t i) {
                                    auto r = weak.lock();
                                    if (r == nullptr) return;
                                    auto tiles = r->MarkReady(first + i, 1);
                                    if (tiles.ok()) r->engine()->Enqueue(r, *tiles);
                                  });
    watches_[record->id()] = Watched{std::move(handle), std::move(ready.first), record};
  }

  // Drops flag watches of ended transfers (called from the deadline thread).
  void SweepWatches() {
    std::vector<Watched> done;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = watches_.begin(); it != watches_.end();) {
        auto r = it->second.record.lock();
        if (r == nullptr || r->IsFinal()) {
          done.push_back(std::move(it->second));
          watches_.erase(it++);
        } else {
          ++it;
        }
      }
    }
    // `done` is destroyed here, outside mu_ (a handle's destructor takes the watcher's lock).
  }

  absl::StatusOr<std::shared_ptr<Record>> Find(uint64_t id) const {
    absl::MutexLock lock(&mu_);
    auto it = records_.find(id);
    if (it == records_.end()) {
      return absl::NotFoundError(absl::StrCat("transfer_id: no transfer ", id));
    }
    return it->second;
  }

  absl::StatusOr<Admitted> BeginInbound(const v1::TransferSpec& spec, const planner::Plan& plan,
                                        std::shared_ptr<regions::Region> source,
                                        std::shared_ptr<regions::Region> dst,
                                        const std::string& sender_node,
                                        uint64_t sender_transfer_id) override {
    {
      absl::MutexLock lock(&mu_);
      if (draining_) return absl::UnavailableError("the receiving daemon is draining");
    }
    // The sender's idempotency key, deadline, layer pacing and flag words are the sender's
    // business (its regions, its node): here every tile is expected and reported as it lands.
    v1::TransferSpec local = v1::WithoutBlockTables(spec);
    local.clear_idempotency_key();
    local.clear_layerwise();
    local.clear_ready_flags();
    local.clear_arrival_flags();
    KVRAIL_ASSIGN_OR_RETURN(const uint64_t id, NextId());
    auto record = std::make_shared<Record>(
        id, local, std::move(source), std::move(dst), plan, ToClass(spec.priority()),
        v1::PATH_FABRIC,
        absl::StrCat("from node '", sender_node, "' (its transfer ", sender_transfer_id, ")"),
        &inbound_engine_, std::nullopt, counters_, clock_);
    record->MarkInbound();
    record->SetLink(absl::StrCat("fabric:", sender_node));
    (void)record->TakeInitialTiles();  // all expected; the fabric reports them as they land
    {
      absl::MutexLock lock(&mu_);
      AdmitLocked(record, local);
    }
    spdlog::info("transfer {} accepted: inbound from '{}' (its transfer {}), {} bytes, {} tiles",
                 id, sender_node, sender_transfer_id, plan.bytes_total(), plan.num_tiles());
    return Admitted{id, record};
  }

  void EndInbound(uint64_t id, const absl::Status& why) override {
    auto record = Find(id);
    if (record.ok()) End(*record, why);
  }

  void End(const std::shared_ptr<Record>& record, const absl::Status& why) {
    if (record->IsFinal()) return;
    const size_t removed = record->engine()->Remove(record.get());
    if (record->RequestEnd(why, removed)) {
      spdlog::info("transfer {} ending: {}", record->id(), why.ToString());
    }
  }

  uint64_t ActiveCount() const {
    absl::MutexLock c(&counters_->mu);
    return counters_->active;
  }

  std::vector<std::shared_ptr<Record>> Open() const {
    std::vector<std::shared_ptr<Record>> open;
    absl::MutexLock lock(&mu_);
    for (const auto& [id, record] : records_) {
      if (!record->IsFinal()) open.push_back(record);
    }
    return open;
  }

  // Forgets the oldest ended transfers beyond the history size (running ones are kept).
  void TrimHistoryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (order_.size() > options_.history) {
      const uint64_t oldest = order_.front();
      auto it = records_.find(oldest);
      if (it != records_.end() && !it->second->IsFinal()) break;
      if (it != records_.end()) {
        const std::string& key = it->second->Status().spec().idempotency_key();
        if (!key.empty()) by_key_.erase(key);
        records_.erase(it);
      }
      order_.pop_front();
    }
  }

  void DeadlineLoop() {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(5));
      if (stopping_) break;
      mu_.Unlock();
      CheckDeadlines();
      SweepWatches();
      mu_.Lock();
    }
  }

  regions::RegionTable* const regions_;
  engine::Engine* const engine_;
  InboundEngine inbound_engine_;
  Clock* const clock_;
  const Options options_;
  const std::shared_ptr<Counters> counters_;
  const std::vector<int> gpu_index_;  // CUDA ordinal -> topology GPU index

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Record>> records_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> by_key_ ABSL_GUARDED_BY(mu_);
  // Transfers submitted with a deadline, dropped once they end (CheckDeadlines).
  std::list<std::weak_ptr<Record>> with_deadline_ ABSL_GUARDED_BY(mu_);
  struct Watched {
    std::unique_ptr<readiness::WatchHandle> handle;
    std::shared_ptr<regions::Region> region;  // keeps the flag words mapped
    std::weak_ptr<Record> record;
  };
  const std::unique_ptr<readiness::FlagWatcher> watcher_;
  absl::flat_hash_map<uint64_t, Watched> watches_ ABSL_GUARDED_BY(mu_);
  std::thread deadline_thread_;
};

}  // namespace

std::unique_ptr<TransferManager> TransferManager::Create(regions::RegionTable* regions,
                                                         engine::Engine* engine, Clock* clock,
                                                         const Options& options) {
  return std::make_unique<TransferManagerImpl>(regions, engine, clock, options);
}

}  // namespace kvrail::transfers
