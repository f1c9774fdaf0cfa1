// Internal to the transfers module: one transfer's state, shared by the manager (requests,
// watches) and the engine (tile reports).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "daemon/engine/engine.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "daemon/transfers/remote_path.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::transfers {

// TransferStatus.link and the metrics' link label of a fabric transfer, the same on the sending
// and the receiving daemon: "fabric:<sender node>-><receiver node>".
std::string FabricLinkName(const std::string& from_node, const std::string& to_node);

// Counters shared by all records of one manager. Thread-safe (guarded by `mu`).
struct Counters {
  mutable absl::Mutex mu;
  uint64_t submitted ABSL_GUARDED_BY(mu) = 0;
  uint64_t succeeded ABSL_GUARDED_BY(mu) = 0;
  uint64_t failed ABSL_GUARDED_BY(mu) = 0;
  uint64_t cancelled ABSL_GUARDED_BY(mu) = 0;
  uint64_t active ABSL_GUARDED_BY(mu) = 0;
  uint64_t bytes_moved ABSL_GUARDED_BY(mu) = 0;
  std::map<std::string, uint64_t> bytes_by_path ABSL_GUARDED_BY(mu);
  // Called with the final status of every transfer that ends (metrics). Set before the first
  // transfer, then read-only.
  std::function<void(const v1::TransferStatus&)> on_finished;
  // Bytes counted tile by tile as tiles land (Stats.bytes_by_class, bytes_by_link): one slot per
  // key, created on first use and never removed, so a record keeps pointers to its slots and adds
  // to them without the lock. Keys: "<path>/<priority>" and the link name.
  std::map<std::string, std::unique_ptr<std::atomic<uint64_t>>> class_bytes ABSL_GUARDED_BY(mu);
  std::map<std::string, std::unique_ptr<std::atomic<uint64_t>>> link_bytes ABSL_GUARDED_BY(mu);
  // Submits refused, by status code name (Stats.rejected_by_code).
  std::map<std::string, uint64_t> rejected_by_code ABSL_GUARDED_BY(mu);
  // The slot for `key` in `slots` (one of the two maps above), created when missing.
  std::atomic<uint64_t>* Slot(std::map<std::string, std::unique_ptr<std::atomic<uint64_t>>>& slots,
                              const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto& slot = slots[key];
    if (slot == nullptr) slot = std::make_unique<std::atomic<uint64_t>>(0);
    return slot.get();
  }
};

// What a record is made of besides its plan (Record's constructor).
struct RecordParams {
  uint64_t id = 0;
  // The caller's spec without block tables (v1::WithoutBlockTables: the tables are in the plan).
  // The record drops its grant tokens (no status returns one).
  v1::TransferSpec spec;
  std::shared_ptr<regions::Region> src;
  std::shared_ptr<regions::Region> dst;
  engine::PriorityClass priority = engine::PriorityClass::kNormal;
  v1::Path path = v1::PATH_UNSPECIFIED;
  std::string path_reason;
  engine::Engine* engine = nullptr;  // runs the record's tiles; not owned
  std::optional<absl::Time> deadline;
  std::shared_ptr<Counters> counters;
  Clock* clock = nullptr;
  // The link the bytes cross (TransferStatus.link): "host", "gpu0-gpu1", "fabric", ...
  std::string link;
  // When the daemon began handling the Submit (TransferStatus.received_unix_us); 0: unknown.
  int64_t received_us = 0;
  // A transfer another node writes into this one (PATH_FABRIC, receiving side): its tiles are
  // reported by the fabric as they land, and it cannot be cancelled here.
  bool inbound = false;
  // The session whose readiness the transfer waits on (Record::WaitsOn); 0: none.
  uint64_t readiness_session = 0;
  // Consumer readiness (spec.arrival_flags): `words[i] = value` once layer i has landed; the
  // record keeps `arrival_region` mapped until it ends. Null: none.
  std::shared_ptr<regions::Region> arrival_region;
  uint32_t* arrival_words = nullptr;
  uint32_t arrival_value = 0;
  // Producer readiness (spec.ready_flags): word i gates transfer layer i. Offered to the engine
  // (Record::ready_gate) for the GPU-side wait; the record keeps `ready_region` mapped until it
  // ends. Null: none.
  std::shared_ptr<regions::Region> ready_region;
  uint32_t* ready_words = nullptr;
  uint32_t ready_value = 0;
};

// Thread-safe: every mutable field is guarded by mu_. `version_` grows with every change so
// watchers can wait for "anything new". Once the record has ended (a final state), tile reports
// change nothing: a late report is ignored, never counted.
class Record final : public InboundJob {
 public:
  Record(planner::Plan plan, RecordParams params);
  ~Record() override;

  uint64_t id() const { return id_; }
  const std::optional<absl::Time>& deadline() const { return deadline_; }
  bool layerwise() const { return layerwise_; }
  // NICs carrying a fabric transfer (TransferStatus.nics).
  void SetNics(std::vector<std::string> nics);
  // Calls `done` with the final status once the transfer ends (at once, on this thread, when it
  // already has). `done` runs under the record's lock on whichever thread ends the transfer:
  // it must be quick, must not block and must not call back into the record. At most
  // kMaxWhenEnded are kept per transfer (RESOURCE_EXHAUSTED beyond: `done` is not kept);
  // the manager's own bookkeeping (`counted` false: at most one or two per record) is not
  // counted, so clients still get all kMaxWhenEnded.
  static constexpr size_t kMaxWhenEnded = 4096;
  absl::Status WhenEnded(std::function<void(const v1::TransferStatus&)> done, bool counted = true);
  // The engine that runs the record's tiles.
  engine::Engine* engine() const { return engine_; }
  bool inbound() const { return inbound_; }
  // The submitting session (spec.session_id; 0: anonymous, and for inbound transfers, whose
  // submitter is on another node).
  uint64_t submitter_session() const { return spec_.session_id(); }
  // The session owning an inbound transfer's destination, which may read its status (0: none,
  // and for transfers submitted here).
  uint64_t dst_owner_session() const { return dst_owner_session_; }
  // The session owning the source region (0: none, and for inbound transfers, whose source is on
  // another node): the producer of a pull, which may mark its layers ready.
  uint64_t src_owner_session() const { return src_session_; }
  // Whether `session` (not 0) owns memory the transfer writes: its destination or arrival-flag
  // region. When that session ends the transfer ends too (EndSession): nothing is written into
  // the memory of an ended session.
  bool WritesRegionOf(uint64_t session) const {
    return session != 0 && (dst_session_ == session || arrival_session_ == session);
  }
  // Whether the transfer has not ended and some of its layers are not ready yet (layer-wise
  // only): once the source's owner ended, nobody vouches for those layers' bytes (EndSession).
  // A transfer whose every layer was ready reads final bytes and may finish.
  bool AwaitsLayers() const;
  // Whether the transfer has not ended and waits for a layer `session` must make ready: it is
  // the producer (MarkReady by the submitter, or spec.ready_flags in its region).
  bool WaitsOn(uint64_t session) const;
  // spec.dst.node_id: the peer an outbound fabric transfer writes to ("" or this node: local).
  const std::string& spec_dst_node() const { return spec_.dst().node_id(); }

  // job::Job
  const planner::Plan& plan() const override { return plan_; }
  const uint8_t* src_base() const override { return src_->data(); }
  uint8_t* dst_base() const override { return dst_->data(); }
  void OnEngineNote(absl::string_view note) override;
  job::PriorityClass priority() const override { return priority_; }
  void OnTileStart(uint32_t tile) override;
  void OnTileDone(uint32_t tile, const absl::Status& status) override;
  // spec.digest: the engines' per-tile digests, summed into TransferStatus.digest.
  bool wants_digest() const override { return spec_.digest(); }
  void OnTileDigest(uint32_t tile, uint64_t source, uint64_t destination) override;
  bool MayGetMoreTiles() const override { return layerwise_ && !IsFinal(); }
  absl::Status ended(bool* producer_gone) const override;
  // The regions' placements and device addresses, spec.ready_flags as the GPU-side readiness
  // wait's gate, and the engine's mode report.
  job::DeviceSides* device_sides() const override { return &sides_; }
  // The engine admitted the record's gate (Engine::AdmitGated): every layer is handed over now
  // (returns every tile, counted as enqueued) and the record waits on its producer until each
  // word has reached the value (WaitsOn).
  std::vector<uint32_t> TakeGatedTiles();
  // The session making the layers ready ended (EndSession): an ended gated record's pending GPU
  // waits are released at once (Job::ended's producer_gone).
  void MarkProducerGone();

  // Tiles to hand to the engine now (all for bulk transfers, none for layer-wise ones); counts
  // them as enqueued.
  std::vector<uint32_t> TakeInitialTiles();
  // Marks layers ready (transfer numbering) and returns their tiles, counted as enqueued. Layers
  // already marked contribute nothing.
  absl::StatusOr<std::vector<uint32_t>> MarkReady(uint32_t layer_begin, uint32_t layer_count);
  // Asks the transfer to end with `status` (CANCELLED for a cancel); `removed` tiles were taken
  // off the engine queue and will never report. An inbound record drops every tile that has not
  // landed (they are the sender's queue), counted under the record's lock so a tile landing
  // meanwhile is counted once. Returns false when it had already ended.
  bool RequestEnd(const absl::Status& status, size_t removed);
  bool IsFinal() const;
  // InboundJob
  bool Ended() const override { return IsFinal(); }

  v1::TransferStatus Status() const;
  uint64_t version() const;
  // Blocks until version() != `seen` or the state is final, or `timeout` passes.
  void AwaitChange(uint64_t seen, absl::Duration timeout) const;
  // Layers completed so far, in completion order.
  std::vector<uint32_t> LayersDone() const;

 private:
  // Job::device_sides: the record's regions as GPU code reaches them. Thread-safe (the regions
  // are read only while tiles of the record run, which ends before they are released; the gate
  // and the report take the record's lock).
  class Sides final : public job::DeviceSides {
   public:
    explicit Sides(Record* record) : record_(record) {}
    job::Placement src() const override { return PlacementOf(*record_->src_); }
    job::Placement dst() const override { return PlacementOf(*record_->dst_); }
    absl::StatusOr<uint8_t*> DeviceAddress(job::Side side, int accessor) const override {
      return (side == job::Side::kSrc ? record_->src_ : record_->dst_)->DeviceAddress(accessor);
    }
    absl::StatusOr<std::shared_ptr<const planner::LayerBases>> DeviceLayerBases(
        job::Side side, int accessor) const override {
      return (side == job::Side::kSrc ? record_->src_ : record_->dst_)->DeviceLayerBases(accessor);
    }
    // spec.ready_flags as the CUDA engine's gate: the words' device address on GPU `accessor`
    // from the flag region's mapping.
    std::optional<job::ReadyGate> ready_gate(int accessor) const override {
      return record_->ReadyGateFor(accessor);
    }
    void OnEngineUsed(absl::string_view engine) override { record_->EngineUsed(engine); }

   private:
    static job::Placement PlacementOf(const regions::Region& region) {
      return region.spec().memory_kind() == v1::MEMORY_KIND_CUDA
                 ? job::Placement::Gpu(region.spec().device(), region.data())
                 : job::Placement::Host(region.data());
    }
    Record* const record_;
  };
  std::optional<job::ReadyGate> ReadyGateFor(int accessor) const;
  void EngineUsed(absl::string_view engine);
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the record's hold on its regions (and arrival flags); idempotent.
  void ReleaseRegionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillStatusLocked(v1::TransferStatus* status) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t id_;
  const v1::TransferSpec spec_;  // block ids and grant tokens stripped
  // Dropped when the transfer ends (so an unregistered region's memory, e.g. a CUDA IPC mapping,
  // is released then, not when the record leaves the history). Engines read them only while
  // tiles of the record run, which ends before the final state.
  std::shared_ptr<regions::Region> src_;
  std::shared_ptr<regions::Region> dst_;
  // Its block tables are freed when the transfer ends (no tile runs then; engines use only the
  // header afterwards). Everything else is immutable after construction.
  planner::Plan plan_;
  const engine::PriorityClass priority_;
  const v1::Path path_;
  const std::string path_reason_;
  engine::Engine* const engine_;
  const std::optional<absl::Time> deadline_;
  const bool layerwise_;
  const std::shared_ptr<Counters> counters_;
  Clock* const clock_;
  const int64_t submitted_us_;
  const bool inbound_;
  const std::string link_;
  const int64_t received_us_;
  const uint64_t dst_owner_session_;
  const uint64_t readiness_session_;
  // The sessions owning src_, dst_ and the arrival-flag region (0: none), kept after the regions
  // are released.
  const uint64_t src_session_;
  const uint64_t dst_session_;
  const uint64_t arrival_session_;

  mutable Sides sides_{this};

  mutable absl::Mutex mu_;
  v1::TransferState state_ ABSL_GUARDED_BY(mu_) = v1::TRANSFER_STATE_QUEUED;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_done_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t tiles_done_ ABSL_GUARDED_BY(mu_) = 0;
  // spec.digest: sums and the first (lowest) mismatching tile so far.
  v1::IntegrityDigest digest_ ABSL_GUARDED_BY(mu_);
  uint32_t tiles_enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t tiles_reported_ ABSL_GUARDED_BY(mu_) = 0;  // done, failed or removed from the queue
  std::vector<uint32_t> layer_tiles_left_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> layer_ready_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> layers_done_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> end_request_ ABSL_GUARDED_BY(mu_);
  int64_t started_us_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t finished_us_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<regions::Region> arrival_region_ ABSL_GUARDED_BY(mu_);
  uint32_t* arrival_words_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint32_t arrival_value_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<regions::Region> ready_region_ ABSL_GUARDED_BY(mu_);
  uint32_t* ready_words_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint32_t ready_value_ ABSL_GUARDED_BY(mu_) = 0;
  bool gated_ ABSL_GUARDED_BY(mu_) = false;
  bool producer_gone_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> nics_ ABSL_GUARDED_BY(mu_);
  // Counters' tile-by-tile byte slots for this record's path and priority, and its link(s) (the
  // NICs once SetNics names them; a tile's bytes are split evenly over them).
  std::atomic<uint64_t>* class_slot_ = nullptr;  // set in the constructor, then read-only
  std::vector<std::atomic<uint64_t>*> link_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(const v1::TransferStatus&)>> when_ended_ ABSL_GUARDED_BY(mu_);
  size_t when_ended_counted_ ABSL_GUARDED_BY(mu_) = 0;  // of them, callers' (kMaxWhenEnded)
  // The engine's name, refined by OnEngineUsed ("cuda-kernel", "cuda-kernel+cuda-copy-engine").
  std::string engine_name_ ABSL_GUARDED_BY(mu_);
  // The engine's note (OnEngineNote), appended to path_reason_ in the status.
  std::string engine_note_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail::transfers
