#include "daemon/transfers/record.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/dcheck.h"
#include "daemon/readiness/readiness.h"

namespace kvrail::transfers {
namespace {

std::string PathKey(v1::Path path) {
  std::string name = v1::Path_Name(path);
  if (name.rfind("PATH_", 0) == 0) name = name.substr(5);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// `spec` without its grant tokens (TransferEndpoint.grant, FlagArray.grant). A token is a
// bearer credential handed to the other party once, out of band; the record keeps none, so no
// status (Get, Wait, Watch, List, the session socket's DONE) shows one to the operator, to an
// inbound transfer's destination owner or to anyone else. The grants were checked and their uses
// registered (GrantUses) before the record was made.
v1::TransferSpec WithoutGrantTokens(v1::TransferSpec spec) {
  if (spec.has_src()) spec.mutable_src()->clear_grant();
  if (spec.has_dst()) spec.mutable_dst()->clear_grant();
  if (spec.has_ready_flags()) spec.mutable_ready_flags()->clear_grant();
  if (spec.has_arrival_flags()) spec.mutable_arrival_flags()->clear_grant();
  return spec;
}

}  // namespace

namespace record {

Progress::Progress(const planner::Plan& plan, std::atomic<uint64_t>* class_slot,
                   std::atomic<uint64_t>* link_slot)
    : layer_tiles_left_(plan.num_layers(), 0),
      layer_ready_(plan.num_layers(), false),
      class_slot_(class_slot),
      link_slots_{link_slot} {
  for (uint32_t t = 0; t < plan.num_tiles(); ++t) ++layer_tiles_left_[plan.tile(t).layer];
}

std::vector<uint32_t> Progress::EnqueueAll(const planner::Plan& plan) {
  std::vector<uint32_t> tiles(plan.num_tiles());
  for (uint32_t t = 0; t < plan.num_tiles(); ++t) tiles[t] = t;
  std::fill(layer_ready_.begin(), layer_ready_.end(), true);
  tiles_enqueued_ += plan.num_tiles();
  return tiles;
}

std::vector<uint32_t> Progress::EnqueueGated(const planner::Plan& plan) {
  std::vector<uint32_t> tiles;
  gated_ = true;
  for (uint32_t t = 0; t < plan.num_tiles(); ++t) {
    if (!layer_ready_[plan.tile(t).layer]) tiles.push_back(t);
  }
  std::fill(layer_ready_.begin(), layer_ready_.end(), true);
  tiles_enqueued_ += tiles.size();
  return tiles;
}

std::vector<uint32_t> Progress::EnqueueLayers(const planner::Plan& plan, uint32_t first,
                                              uint32_t count) {
  std::vector<uint32_t> tiles;
  for (uint32_t l = first; l < first + count; ++l) {
    if (layer_ready_[l]) continue;
    layer_ready_[l] = true;
    // Tiles are ordered by layer, the same number per layer.
    const uint32_t per_layer = plan.tiles_per_layer();
    for (uint32_t t = l * per_layer; t < (l + 1) * per_layer && t < plan.num_tiles(); ++t) {
      tiles.push_back(t);
    }
  }
  tiles_enqueued_ += tiles.size();
  return tiles;
}

bool Progress::AllLayersReady() const {
  return std::find(layer_ready_.begin(), layer_ready_.end(), false) == layer_ready_.end();
}

bool Progress::TakeReport() {
  if (tiles_reported_ >= tiles_enqueued_) return false;
  ++tiles_reported_;
  return true;
}

void Progress::DropUnreported(bool all, size_t removed) {
  KVRAIL_DCHECK(tiles_reported_ <= tiles_enqueued_, "transfer: more tiles reported than enqueued");
  const uint32_t unreported =
      tiles_reported_ <= tiles_enqueued_ ? tiles_enqueued_ - tiles_reported_ : 0;
  tiles_reported_ +=
      all ? unreported : static_cast<uint32_t>(std::min<size_t>(removed, unreported));
}

bool Progress::Land(const planner::TileInfo& info) {
  ++tiles_done_;
  bytes_done_ += info.bytes;
  // Counted as the tile lands (metrics, Stats.bytes_by_class/bytes_by_link).
  class_slot_->fetch_add(info.bytes, std::memory_order_relaxed);
  const uint64_t share = info.bytes / link_slots_.size();
  for (size_t i = 0; i < link_slots_.size(); ++i) {
    link_slots_[i]->fetch_add(i == 0 ? info.bytes - share * (link_slots_.size() - 1) : share,
                              std::memory_order_relaxed);
  }
  if (--layer_tiles_left_[info.layer] != 0) return false;
  layers_done_.push_back(info.layer);
  return true;
}

void Progress::AddDigest(uint32_t tile, uint32_t layer, uint64_t source, uint64_t destination) {
  const bool was_matched = digest_.tiles_checked() == 0 || digest_.matched();
  digest_.set_source(digest_.source() + source);
  digest_.set_destination(digest_.destination() + destination);
  digest_.set_tiles_checked(digest_.tiles_checked() + 1);
  digest_.set_matched(was_matched && source == destination);
  if (source != destination && (was_matched || tile < digest_.first_mismatch_tile())) {
    digest_.set_first_mismatch_tile(tile);
    digest_.set_first_mismatch_layer(layer);
  }
}

v1::IntegrityDigest Progress::digest() const {
  v1::IntegrityDigest digest = digest_;
  if (digest.tiles_checked() == 0) digest.set_matched(true);
  return digest;
}

std::optional<v1::TransferState> Lifecycle::FinalState(bool all_landed, bool all_reported) const {
  if (all_landed) return v1::TRANSFER_STATE_SUCCEEDED;
  if (!end_request.has_value() || !all_reported) return std::nullopt;
  return end_request->code() == absl::StatusCode::kCancelled ? v1::TRANSFER_STATE_CANCELLED
                                                             : v1::TRANSFER_STATE_FAILED;
}

}  // namespace record

namespace {

record::Resolution ResolutionOf(RecordParams& params) {
  record::Resolution resolution;
  resolution.id = params.id;
  resolution.spec = WithoutGrantTokens(std::move(params.spec));
  resolution.priority = params.priority;
  resolution.path = params.path;
  resolution.path_reason = std::move(params.path_reason);
  resolution.engine = params.engine;
  resolution.deadline = params.deadline;
  resolution.layerwise = resolution.spec.layerwise() || resolution.spec.has_ready_flags();
  resolution.inbound = params.inbound;
  resolution.link = std::move(params.link);
  return resolution;
}

record::Owners OwnersOf(const RecordParams& params) {
  record::Owners owners;
  owners.src = params.src->session_id();
  owners.dst = params.dst->session_id();
  owners.arrival = params.arrival.set() ? params.arrival.region->session_id() : 0;
  owners.inbound_dst = params.inbound ? params.dst->session_id() : 0;
  owners.readiness = params.readiness_session;
  return owners;
}

// The Counters' byte slots of a record of `resolution`: its path and priority's, its link's.
std::pair<std::atomic<uint64_t>*, std::atomic<uint64_t>*> SlotsOf(
    Counters& counters, const record::Resolution& resolution) {
  absl::MutexLock c(&counters.mu);
  return {counters.Slot(counters.class_bytes,
                        absl::StrCat(PathKey(resolution.path), "/",
                                     engine::PriorityClassName(resolution.priority))),
          counters.Slot(counters.link_bytes, resolution.link.empty() ? "-" : resolution.link)};
}

record::Progress ProgressOf(const planner::Plan& plan, Counters& counters,
                            const record::Resolution& resolution) {
  const auto [class_slot, link_slot] = SlotsOf(counters, resolution);
  return record::Progress(plan, class_slot, link_slot);
}

}  // namespace

Record::Record(planner::Plan plan, RecordParams params)
    : resolution_(ResolutionOf(params)),
      owners_(OwnersOf(params)),
      plan_(std::move(plan)),
      src_(std::move(params.src)),
      dst_(std::move(params.dst)),
      counters_(std::move(params.counters)),
      clock_(params.clock),
      progress_(ProgressOf(plan_, *counters_, resolution_)) {
  src_->AcquireUse();
  dst_->AcquireUse();
  absl::MutexLock lock(&mu_);
  timeline_.received_us = params.received_us;
  timeline_.submitted_us = clock_->NowUnixMicros();
  timeline_.engine_name = resolution_.engine->name();
  arrival_ = std::move(params.arrival);
  ready_ = std::move(params.ready);
  done_ = std::move(params.done);
  if (plan_.num_tiles() == 0) MaybeFinishLocked();
}

Record::~Record() {
  absl::MutexLock lock(&mu_);
  ReleaseRegionsLocked();
}

void Record::ReleaseRegionsLocked() {
  if (src_ == nullptr) return;  // already released when the transfer ended
  src_->ReleaseUse();
  dst_->ReleaseUse();
  src_.reset();
  dst_.reset();
  arrival_ = ResolvedFlags();
  ready_ = ResolvedFlags();
  done_ = ResolvedDoneWord();
}

std::optional<job::DoneWord> Record::DoneWordFor(int accessor) const {
  std::shared_ptr<regions::Region> region;
  uint64_t* word = nullptr;
  job::DoneWord done;
  {
    absl::MutexLock lock(&mu_);
    // Not for a transfer asked to end: its end comes from the daemon.
    if (!done_.set() || done_.word == nullptr || life_.end_request.has_value()) {
      return std::nullopt;
    }
    region = done_.region;
    word = done_.word;
    done.value = done_.value;
  }
  // Outside the lock: the first call pins the region for the GPUs (cudaHostRegister, mapped).
  const absl::StatusOr<uint8_t*> device = region->DeviceAddress(accessor);
  if (!device.ok()) return std::nullopt;
  done.device_word =
      reinterpret_cast<uint64_t>(*device) + (reinterpret_cast<uint8_t*>(word) - region->data());
  done.keep = region;
  return done;
}

std::optional<job::ReadyGate> Record::ReadyGateFor(int accessor) const {
  std::shared_ptr<regions::Region> region;
  job::ReadyGate gate;
  {
    absl::MutexLock lock(&mu_);
    if (ready_.region == nullptr || ready_.words == nullptr) return std::nullopt;
    region = ready_.region;
    gate.host_words = ready_.words;
    gate.value = ready_.value;
  }
  // Outside the lock: the first call pins the flag region for the GPUs (cudaHostRegister).
  const absl::StatusOr<uint8_t*> device = region->DeviceAddress(accessor);
  if (!device.ok()) return std::nullopt;
  gate.device_words = reinterpret_cast<uint64_t>(*device) +
                      (reinterpret_cast<uint8_t*>(gate.host_words) - region->data());
  gate.count = plan_.num_layers();
  gate.field = "spec.ready_flags";
  gate.keep = region;
  return gate;
}

absl::Status Record::ended(bool* producer_gone) const {
  absl::MutexLock lock(&mu_);
  *producer_gone = life_.producer_gone;
  if (life_.end_request.has_value()) return *life_.end_request;
  return absl::OkStatus();
}

std::vector<uint32_t> Record::TakeGatedTiles() {
  absl::MutexLock lock(&mu_);
  if (!life_.open()) return {};
  return progress_.EnqueueGated(plan_);
}

void Record::MarkProducerGone() {
  absl::MutexLock lock(&mu_);
  life_.producer_gone = true;
}

void Record::EngineUsed(absl::string_view engine) {
  absl::MutexLock lock(&mu_);
  std::string& name = timeline_.engine_name;
  if (name == resolution_.engine->name()) {
    name = std::string(engine);
  } else if (name.find(std::string(engine)) == std::string::npos) {
    absl::StrAppend(&name, "+", engine);
  }
}

void Record::OnEngineNote(absl::string_view note) {
  absl::MutexLock lock(&mu_);
  timeline_.engine_note = std::string(note);
  ++life_.version;
}

absl::Status Record::WhenEnded(std::function<void(const v1::TransferStatus&)> done, bool counted,
                               StatusDetail detail) {
  absl::MutexLock lock(&mu_);
  if (life_.final()) {
    v1::TransferStatus status;
    FillStatusLocked(&status, detail);
    done(status);
    return absl::OkStatus();
  }
  if (counted && life_.when_ended_counted >= kMaxWhenEnded) {
    return absl::ResourceExhaustedError(absl::StrCat("transfer ", resolution_.id, " already has ",
                                                     kMaxWhenEnded,
                                                     " waiters; wait with WaitTransfer"));
  }
  if (counted) ++life_.when_ended_counted;
  life_.when_ended.emplace_back(std::move(done), detail);
  return absl::OkStatus();
}

std::string FabricLinkName(const std::string& from_node, const std::string& to_node) {
  return absl::StrCat("fabric:", from_node, "->", to_node);
}

// The bytes stay counted under the node-to-node link (FabricLinkName): the receiver cannot tell
// the sender's lanes apart, and one link must have one name on both sides.
void Record::SetNics(std::vector<std::string> nics) {
  absl::MutexLock lock(&mu_);
  timeline_.nics = std::move(nics);
  ++life_.version;
}

void Record::OnTileStart(uint32_t /*tile*/) {
  absl::MutexLock lock(&mu_);
  if (life_.state == v1::TRANSFER_STATE_QUEUED) {
    life_.state = v1::TRANSFER_STATE_RUNNING;
    timeline_.started_us = clock_->NowUnixMicros();
    ++life_.version;
  }
}

void Record::OnTileDigest(uint32_t tile, uint64_t source, uint64_t destination) {
  absl::MutexLock lock(&mu_);
  if (life_.final()) return;
  progress_.AddDigest(tile, resolution_.spec.src().layer_begin() + plan_.tile(tile).layer, source,
                      destination);
  ++life_.version;
}

void Record::OnTileDone(uint32_t tile, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  // Local engines report every tile before the final state; only an inbound transfer ended early
  // can hear of a tile after it (one landing as the sender aborts, or after a drain): it changes
  // nothing then, so no count overshoots.
  if (life_.final()) return;
  // Nor may a report the record does not expect (a tile never enqueued) push a count past it.
  if (!progress_.TakeReport()) return;
  // A region whose host memory faulted under the copy (its owner truncated it) fails the tile:
  // its bytes came from or went to zero pages (docs/security.md, "Memory").
  absl::Status health =
      status.ok() && src_ != nullptr ? src_->Health("spec.src") : absl::OkStatus();
  if (health.ok() && status.ok() && dst_ != nullptr) health = dst_->Health("spec.dst");
  const absl::Status& outcome = health.ok() ? status : health;
  if (outcome.ok()) {
    const planner::TileInfo info = plan_.tile(tile);
    if (progress_.Land(info) && arrival_.words != nullptr) {
      readiness::SignalFlag(arrival_.words, info.layer, arrival_.value);
    }
  } else if (!life_.end_request.has_value()) {
    life_.end_request = outcome;
  }
  ++life_.version;
  MaybeFinishLocked();
}

std::vector<uint32_t> Record::TakeInitialTiles() {
  absl::MutexLock lock(&mu_);
  if (resolution_.layerwise || life_.end_request.has_value()) return {};
  return progress_.EnqueueAll(plan_);
}

bool Record::WaitsOn(uint64_t session) const {
  if (session == 0 || owners_.readiness != session) return false;
  return AwaitsLayers();
}

bool Record::AwaitsLayers() const {
  if (!resolution_.layerwise) return false;
  absl::MutexLock lock(&mu_);
  if (!life_.open()) return false;
  if (progress_.gated()) {
    // Handed to the GPU wait at once: it waits on its producer until every word has come.
    if (ready_.words == nullptr) return false;
    for (uint32_t l = 0; l < plan_.num_layers(); ++l) {
      if (!readiness::Reached(__atomic_load_n(&ready_.words[l], __ATOMIC_ACQUIRE), ready_.value)) {
        return true;
      }
    }
    return false;
  }
  return !progress_.AllLayersReady();
}

absl::StatusOr<std::vector<uint32_t>> Record::MarkReady(uint32_t layer_begin,
                                                        uint32_t layer_count) {
  absl::MutexLock lock(&mu_);
  if (!resolution_.layerwise) {
    return absl::FailedPreconditionError(absl::StrCat("transfer_id: transfer ", resolution_.id,
                                                      " is not layer-wise (spec.layerwise=false)"));
  }
  const uint32_t first = resolution_.spec.src().layer_begin();
  if (layer_begin < first || layer_begin - first >= plan_.num_layers() ||
      layer_count > plan_.num_layers() - (layer_begin - first)) {
    return absl::OutOfRangeError(absl::StrCat("layer_begin: layers [", layer_begin, ", ",
                                              uint64_t{layer_begin} + layer_count,
                                              ") are outside the transfer's source layers [", first,
                                              ", ", first + plan_.num_layers(), ")"));
  }
  if (!life_.open()) return std::vector<uint32_t>();
  return progress_.EnqueueLayers(plan_, layer_begin - first, layer_count);
}

bool Record::RequestEnd(const absl::Status& status, size_t removed) {
  absl::MutexLock lock(&mu_);
  if (life_.final()) return false;
  // An inbound transfer's unlanded tiles are queued at the sender: ending it here drops them all.
  // Counted now, under the lock, so a tile that landed since the engine counted `removed` is not
  // counted twice (which left the count past the enqueued one and the record open for ever).
  progress_.DropUnreported(resolution_.inbound, removed);
  if (!life_.end_request.has_value()) life_.end_request = status;
  ++life_.version;
  MaybeFinishLocked();
  return true;
}

bool Record::IsFinal() const {
  absl::MutexLock lock(&mu_);
  return life_.final();
}

void Record::MaybeFinishLocked() {
  if (life_.final()) return;
  const std::optional<v1::TransferState> final_state =
      life_.FinalState(progress_.tiles_done() >= plan_.num_tiles(), progress_.AllReported());
  if (!final_state.has_value()) return;
  life_.state = *final_state;
  timeline_.finished_us = clock_->NowUnixMicros();
  ++life_.version;
  // An ended transfer holds no region: mappings (CUDA IPC ones too) go as soon as their last
  // user does, not when the record leaves the history. Nor its block tables: a history of 10k
  // large transfers would otherwise keep gigabytes (and every submit faults in fresh memory).
  ReleaseRegionsLocked();
  plan_.ReleaseBlockTables();
  if (counters_->on_finished || !life_.when_ended.empty()) {
    // The end's fields for those that read only them (the completion queue's entry, the
    // metrics, the log line); the whole status, with its copy of the spec, only if a listener
    // asked for it (a WAIT's DONE, WaitTransfer, a notification).
    v1::TransferStatus end;
    FillStatusLocked(&end, StatusDetail::kEnd);
    std::optional<v1::TransferStatus> whole;
    // Waiters first (a WAIT's DONE and the completion queue's entry go out here), then the
    // metrics and the log line. Those are off the path of a client that waits for the end, not
    // of one whose submit is answered after it: a small host transfer run inline by the admitting
    // thread (Engine::EnqueueAdmitted) ends before that thread posts the submission queue's
    // acknowledgement.
    for (auto& [done, detail] : life_.when_ended) {
      if (detail == StatusDetail::kEnd) {
        done(end);
        continue;
      }
      if (!whole.has_value()) FillStatusLocked(&whole.emplace(), StatusDetail::kWhole);
      done(*whole);
    }
    life_.when_ended.clear();
    if (counters_->on_finished) counters_->on_finished(end);
  }
  absl::MutexLock c(&counters_->mu);
  --counters_->active;
  counters_->bytes_moved += progress_.bytes_done();
  counters_->bytes_by_path[PathKey(resolution_.path)] += progress_.bytes_done();
  if (*final_state == v1::TRANSFER_STATE_SUCCEEDED) ++counters_->succeeded;
  if (*final_state == v1::TRANSFER_STATE_FAILED) ++counters_->failed;
  if (*final_state == v1::TRANSFER_STATE_CANCELLED) ++counters_->cancelled;
}

void Record::FillStatusLocked(v1::TransferStatus* status, StatusDetail detail) const {
  const v1::TransferSpec& spec = resolution_.spec;
  const bool whole = detail == StatusDetail::kWhole;
  status->set_transfer_id(resolution_.id);
  if (whole) {
    *status->mutable_spec() = spec;
  } else if (spec.priority() != v1::PRIORITY_UNSPECIFIED) {
    status->mutable_spec()->set_priority(spec.priority());
  }
  status->set_state(life_.state);
  status->set_bytes_total(plan_.bytes_total());
  status->set_bytes_done(progress_.bytes_done());
  status->set_tiles_total(plan_.num_tiles());
  status->set_tiles_done(progress_.tiles_done());
  status->set_layers_done(static_cast<uint32_t>(progress_.layers_done().size()));
  status->set_path(resolution_.path);
  if (whole) {
    status->set_path_reason(
        timeline_.engine_note.empty()
            ? resolution_.path_reason
            : absl::StrCat(resolution_.path_reason, "; ", timeline_.engine_note));
  }
  status->set_engine(timeline_.engine_name);
  if (spec.digest()) *status->mutable_digest() = progress_.digest();
  if (life_.state == v1::TRANSFER_STATE_FAILED || life_.state == v1::TRANSFER_STATE_CANCELLED) {
    status->set_error_code(static_cast<int32_t>(life_.end_request->code()));
    status->set_error_message(std::string(life_.end_request->message()));
  }
  status->set_submitted_unix_us(timeline_.submitted_us);
  status->set_started_unix_us(timeline_.started_us);
  status->set_finished_unix_us(timeline_.finished_us);
  status->set_received_unix_us(timeline_.received_us);
  if (!whole) return;
  for (const std::string& nic : timeline_.nics) status->add_nics(nic);
  status->set_link(resolution_.link);
}

v1::TransferStatus Record::Status() const {
  v1::TransferStatus status;
  absl::MutexLock lock(&mu_);
  FillStatusLocked(&status);
  return status;
}

uint64_t Record::version() const {
  absl::MutexLock lock(&mu_);
  return life_.version;
}

void Record::AwaitChange(uint64_t seen, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return life_.version != seen || life_.final();
  };
  mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
}

std::vector<uint32_t> Record::LayersDone() const {
  absl::MutexLock lock(&mu_);
  return progress_.layers_done();
}

}  // namespace kvrail::transfers
