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

Record::Record(planner::Plan plan, RecordParams params)
    : id_(params.id),
      spec_(WithoutGrantTokens(std::move(params.spec))),
      src_(std::move(params.src)),
      dst_(std::move(params.dst)),
      plan_(std::move(plan)),
      priority_(params.priority),
      path_(params.path),
      path_reason_(std::move(params.path_reason)),
      engine_(params.engine),
      deadline_(params.deadline),
      layerwise_(spec_.layerwise() || spec_.has_ready_flags()),
      counters_(std::move(params.counters)),
      clock_(params.clock),
      submitted_us_(params.clock->NowUnixMicros()),
      inbound_(params.inbound),
      link_(std::move(params.link)),
      received_us_(params.received_us),
      dst_owner_session_(inbound_ ? dst_->session_id() : 0),
      readiness_session_(params.readiness_session),
      src_session_(src_->session_id()),
      dst_session_(dst_->session_id()),
      arrival_session_(params.arrival_region != nullptr ? params.arrival_region->session_id() : 0) {
  src_->AcquireUse();
  dst_->AcquireUse();
  std::atomic<uint64_t>* link_slot = nullptr;
  {
    absl::MutexLock c(&counters_->mu);
    class_slot_ =
        counters_->Slot(counters_->class_bytes,
                        absl::StrCat(PathKey(path_), "/", engine::PriorityClassName(priority_)));
    link_slot = counters_->Slot(counters_->link_bytes, link_.empty() ? "-" : link_);
  }
  absl::MutexLock lock(&mu_);
  link_slots_ = {link_slot};
  arrival_region_ = std::move(params.arrival_region);
  arrival_words_ = params.arrival_words;
  arrival_value_ = params.arrival_value;
  ready_region_ = std::move(params.ready_region);
  ready_words_ = params.ready_words;
  ready_value_ = params.ready_value;
  engine_name_ = engine_->name();
  layer_tiles_left_.assign(plan_.num_layers(), 0);
  layer_ready_.assign(plan_.num_layers(), false);
  for (uint32_t t = 0; t < plan_.num_tiles(); ++t) ++layer_tiles_left_[plan_.tile(t).layer];
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
  arrival_words_ = nullptr;
  arrival_region_.reset();
  ready_words_ = nullptr;
  ready_region_.reset();
}

std::optional<job::ReadyGate> Record::ReadyGateFor(int accessor) const {
  std::shared_ptr<regions::Region> region;
  job::ReadyGate gate;
  {
    absl::MutexLock lock(&mu_);
    if (ready_region_ == nullptr || ready_words_ == nullptr) return std::nullopt;
    region = ready_region_;
    gate.host_words = ready_words_;
    gate.value = ready_value_;
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
  *producer_gone = producer_gone_;
  if (end_request_.has_value()) return *end_request_;
  return absl::OkStatus();
}

std::vector<uint32_t> Record::TakeGatedTiles() {
  std::vector<uint32_t> tiles;
  absl::MutexLock lock(&mu_);
  if (end_request_.has_value() || state_ >= v1::TRANSFER_STATE_SUCCEEDED) return tiles;
  gated_ = true;
  for (uint32_t t = 0; t < plan_.num_tiles(); ++t) {
    if (!layer_ready_[plan_.tile(t).layer]) tiles.push_back(t);
  }
  std::fill(layer_ready_.begin(), layer_ready_.end(), true);
  tiles_enqueued_ += tiles.size();
  return tiles;
}

void Record::MarkProducerGone() {
  absl::MutexLock lock(&mu_);
  producer_gone_ = true;
}

void Record::EngineUsed(absl::string_view engine) {
  absl::MutexLock lock(&mu_);
  if (engine_name_ == engine_->name()) {
    engine_name_ = std::string(engine);
  } else if (engine_name_.find(std::string(engine)) == std::string::npos) {
    absl::StrAppend(&engine_name_, "+", engine);
  }
}

void Record::OnEngineNote(absl::string_view note) {
  absl::MutexLock lock(&mu_);
  engine_note_ = std::string(note);
  ++version_;
}

absl::Status Record::WhenEnded(std::function<void(const v1::TransferStatus&)> done, bool counted) {
  absl::MutexLock lock(&mu_);
  if (state_ >= v1::TRANSFER_STATE_SUCCEEDED) {
    v1::TransferStatus status;
    FillStatusLocked(&status);
    done(status);
    return absl::OkStatus();
  }
  if (counted && when_ended_counted_ >= kMaxWhenEnded) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "transfer ", id_, " already has ", kMaxWhenEnded, " waiters; wait with WaitTransfer"));
  }
  if (counted) ++when_ended_counted_;
  when_ended_.push_back(std::move(done));
  return absl::OkStatus();
}

std::string FabricLinkName(const std::string& from_node, const std::string& to_node) {
  return absl::StrCat("fabric:", from_node, "->", to_node);
}

// The bytes stay counted under the node-to-node link (FabricLinkName): the receiver cannot tell
// the sender's lanes apart, and one link must have one name on both sides.
void Record::SetNics(std::vector<std::string> nics) {
  absl::MutexLock lock(&mu_);
  nics_ = std::move(nics);
  ++version_;
}

void Record::OnTileStart(uint32_t /*tile*/) {
  absl::MutexLock lock(&mu_);
  if (state_ == v1::TRANSFER_STATE_QUEUED) {
    state_ = v1::TRANSFER_STATE_RUNNING;
    started_us_ = clock_->NowUnixMicros();
    ++version_;
  }
}

void Record::OnTileDigest(uint32_t tile, uint64_t source, uint64_t destination) {
  absl::MutexLock lock(&mu_);
  if (state_ >= v1::TRANSFER_STATE_SUCCEEDED) return;
  const bool was_matched = digest_.tiles_checked() == 0 || digest_.matched();
  digest_.set_source(digest_.source() + source);
  digest_.set_destination(digest_.destination() + destination);
  digest_.set_tiles_checked(digest_.tiles_checked() + 1);
  digest_.set_matched(was_matched && source == destination);
  if (source != destination && (was_matched || tile < digest_.first_mismatch_tile())) {
    digest_.set_first_mismatch_tile(tile);
    digest_.set_first_mismatch_layer(spec_.src().layer_begin() + plan_.tile(tile).layer);
  }
  ++version_;
}

void Record::OnTileDone(uint32_t tile, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  // Local engines report every tile before the final state; only an inbound transfer ended early
  // can hear of a tile after it (one landing as the sender aborts, or after a drain): it changes
  // nothing then, so no count overshoots.
  if (state_ >= v1::TRANSFER_STATE_SUCCEEDED) return;
  // Nor may a report the record does not expect (a tile never enqueued) push a count past it.
  if (tiles_reported_ >= tiles_enqueued_) return;
  ++tiles_reported_;
  // A region whose host memory faulted under the copy (its owner truncated it) fails the tile:
  // its bytes came from or went to zero pages (docs/security.md, "Memory").
  absl::Status health =
      status.ok() && src_ != nullptr ? src_->Health("spec.src") : absl::OkStatus();
  if (health.ok() && status.ok() && dst_ != nullptr) health = dst_->Health("spec.dst");
  const absl::Status& outcome = health.ok() ? status : health;
  if (outcome.ok()) {
    const planner::TileInfo info = plan_.tile(tile);
    ++tiles_done_;
    bytes_done_ += info.bytes;
    // Counted as the tile lands (metrics, Stats.bytes_by_class/bytes_by_link).
    class_slot_->fetch_add(info.bytes, std::memory_order_relaxed);
    const uint64_t share = info.bytes / link_slots_.size();
    for (size_t i = 0; i < link_slots_.size(); ++i) {
      link_slots_[i]->fetch_add(i == 0 ? info.bytes - share * (link_slots_.size() - 1) : share,
                                std::memory_order_relaxed);
    }
    if (--layer_tiles_left_[info.layer] == 0) {
      layers_done_.push_back(info.layer);
      if (arrival_words_ != nullptr)
        readiness::SignalFlag(arrival_words_, info.layer, arrival_value_);
    }
  } else if (!end_request_.has_value()) {
    end_request_ = outcome;
  }
  ++version_;
  MaybeFinishLocked();
}

std::vector<uint32_t> Record::TakeInitialTiles() {
  std::vector<uint32_t> tiles;
  absl::MutexLock lock(&mu_);
  if (layerwise_ || end_request_.has_value()) return tiles;
  tiles.resize(plan_.num_tiles());
  for (uint32_t t = 0; t < plan_.num_tiles(); ++t) tiles[t] = t;
  std::fill(layer_ready_.begin(), layer_ready_.end(), true);
  tiles_enqueued_ += plan_.num_tiles();
  return tiles;
}

bool Record::WaitsOn(uint64_t session) const {
  if (session == 0 || readiness_session_ != session) return false;
  return AwaitsLayers();
}

bool Record::AwaitsLayers() const {
  if (!layerwise_) return false;
  absl::MutexLock lock(&mu_);
  if (end_request_.has_value() || state_ >= v1::TRANSFER_STATE_SUCCEEDED) return false;
  if (gated_) {
    // Handed to the GPU wait at once: it waits on its producer until every word has come.
    if (ready_words_ == nullptr) return false;
    for (uint32_t l = 0; l < plan_.num_layers(); ++l) {
      if (!readiness::Reached(__atomic_load_n(&ready_words_[l], __ATOMIC_ACQUIRE), ready_value_)) {
        return true;
      }
    }
    return false;
  }
  return std::find(layer_ready_.begin(), layer_ready_.end(), false) != layer_ready_.end();
}

absl::StatusOr<std::vector<uint32_t>> Record::MarkReady(uint32_t layer_begin,
                                                        uint32_t layer_count) {
  absl::MutexLock lock(&mu_);
  if (!layerwise_) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer_id: transfer ", id_, " is not layer-wise (spec.layerwise=false)"));
  }
  const uint32_t first = spec_.src().layer_begin();
  if (layer_begin < first || layer_begin - first >= plan_.num_layers() ||
      layer_count > plan_.num_layers() - (layer_begin - first)) {
    return absl::OutOfRangeError(absl::StrCat("layer_begin: layers [", layer_begin, ", ",
                                              uint64_t{layer_begin} + layer_count,
                                              ") are outside the transfer's source layers [", first,
                                              ", ", first + plan_.num_layers(), ")"));
  }
  std::vector<uint32_t> tiles;
  if (end_request_.has_value() || state_ >= v1::TRANSFER_STATE_SUCCEEDED) return tiles;
  for (uint32_t l = layer_begin - first; l < layer_begin - first + layer_count; ++l) {
    if (layer_ready_[l]) continue;
    layer_ready_[l] = true;
    // Tiles are ordered by layer, the same number per layer.
    const uint32_t per_layer = plan_.tiles_per_layer();
    for (uint32_t t = l * per_layer; t < (l + 1) * per_layer && t < plan_.num_tiles(); ++t) {
      tiles.push_back(t);
    }
  }
  tiles_enqueued_ += tiles.size();
  return tiles;
}

bool Record::RequestEnd(const absl::Status& status, size_t removed) {
  absl::MutexLock lock(&mu_);
  if (state_ >= v1::TRANSFER_STATE_SUCCEEDED) return false;
  // An inbound transfer's unlanded tiles are queued at the sender: ending it here drops them all.
  // Counted now, under the lock, so a tile that landed since the engine counted `removed` is not
  // counted twice (which left the count past tiles_enqueued_ and the record open for ever).
  KVRAIL_DCHECK(tiles_reported_ <= tiles_enqueued_, "transfer: more tiles reported than enqueued");
  const uint32_t unreported =
      tiles_reported_ <= tiles_enqueued_ ? tiles_enqueued_ - tiles_reported_ : 0;
  tiles_reported_ +=
      inbound_ ? unreported : static_cast<uint32_t>(std::min<size_t>(removed, unreported));
  if (!end_request_.has_value()) end_request_ = status;
  ++version_;
  MaybeFinishLocked();
  return true;
}

bool Record::IsFinal() const {
  absl::MutexLock lock(&mu_);
  return state_ >= v1::TRANSFER_STATE_SUCCEEDED;
}

void Record::MaybeFinishLocked() {
  if (state_ >= v1::TRANSFER_STATE_SUCCEEDED) return;
  v1::TransferState final_state;
  if (tiles_done_ >= plan_.num_tiles()) {
    final_state = v1::TRANSFER_STATE_SUCCEEDED;
  } else if (end_request_.has_value() && tiles_reported_ >= tiles_enqueued_) {
    final_state = end_request_->code() == absl::StatusCode::kCancelled
                      ? v1::TRANSFER_STATE_CANCELLED
                      : v1::TRANSFER_STATE_FAILED;
  } else {
    return;
  }
  state_ = final_state;
  finished_us_ = clock_->NowUnixMicros();
  ++version_;
  // An ended transfer holds no region: mappings (CUDA IPC ones too) go as soon as their last
  // user does, not when the record leaves the history. Nor its block tables: a history of 10k
  // large transfers would otherwise keep gigabytes (and every submit faults in fresh memory).
  ReleaseRegionsLocked();
  plan_.ReleaseBlockTables();
  if (counters_->on_finished || !when_ended_.empty()) {
    v1::TransferStatus status;
    FillStatusLocked(&status);
    // Waiters first (a WAIT's DONE goes out here): the metrics and the log line are not on the
    // client's critical path.
    for (auto& done : when_ended_) done(status);
    when_ended_.clear();
    if (counters_->on_finished) counters_->on_finished(status);
  }
  absl::MutexLock c(&counters_->mu);
  --counters_->active;
  counters_->bytes_moved += bytes_done_;
  counters_->bytes_by_path[PathKey(path_)] += bytes_done_;
  if (final_state == v1::TRANSFER_STATE_SUCCEEDED) ++counters_->succeeded;
  if (final_state == v1::TRANSFER_STATE_FAILED) ++counters_->failed;
  if (final_state == v1::TRANSFER_STATE_CANCELLED) ++counters_->cancelled;
}

void Record::FillStatusLocked(v1::TransferStatus* status) const {
  status->set_transfer_id(id_);
  *status->mutable_spec() = spec_;
  status->set_state(state_);
  status->set_bytes_total(plan_.bytes_total());
  status->set_bytes_done(bytes_done_);
  status->set_tiles_total(plan_.num_tiles());
  status->set_tiles_done(tiles_done_);
  status->set_layers_done(static_cast<uint32_t>(layers_done_.size()));
  status->set_path(path_);
  status->set_path_reason(engine_note_.empty() ? path_reason_
                                               : absl::StrCat(path_reason_, "; ", engine_note_));
  status->set_engine(engine_name_);
  if (spec_.digest()) {
    *status->mutable_digest() = digest_;
    if (digest_.tiles_checked() == 0) status->mutable_digest()->set_matched(true);
  }
  if (state_ == v1::TRANSFER_STATE_FAILED || state_ == v1::TRANSFER_STATE_CANCELLED) {
    status->set_error_code(static_cast<int32_t>(end_request_->code()));
    status->set_error_message(std::string(end_request_->message()));
  }
  status->set_submitted_unix_us(submitted_us_);
  status->set_started_unix_us(started_us_);
  status->set_finished_unix_us(finished_us_);
  for (const std::string& nic : nics_) status->add_nics(nic);
  status->set_link(link_);
  status->set_received_unix_us(received_us_);
}

v1::TransferStatus Record::Status() const {
  v1::TransferStatus status;
  absl::MutexLock lock(&mu_);
  FillStatusLocked(&status);
  return status;
}

uint64_t Record::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

void Record::AwaitChange(uint64_t seen, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return version_ != seen || state_ >= v1::TRANSFER_STATE_SUCCEEDED;
  };
  mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
}

std::vector<uint32_t> Record::LayersDone() const {
  absl::MutexLock lock(&mu_);
  return layers_done_;
}

}  // namespace kvrail::transfers
