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
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "daemon/engine/engine.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "daemon/transfers/remote_path.h"
#include "daemon/transfers/resolve.h"
#include "daemon/transfers/status_detail.h"
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
  // record keeps the region mapped until it ends. Unset: none.
  ResolvedFlags arrival;
  // Producer readiness (spec.ready_flags): word i gates transfer layer i. Offered to the engine
  // (Record::ready_gate) for the GPU-side wait; the record keeps the region mapped until it
  // ends. Unset: none.
  ResolvedFlags ready;
  // The GPU-written completion (spec.done_word): offered to the engine (Record::done_word); the
  // record keeps the region mapped until it ends. Unset: none.
  ResolvedDoneWord done;
};

namespace record {

// What was asked and how it was resolved, fixed when the record is made. Immutable: read from
// any thread without a lock.
struct Resolution {
  uint64_t id = 0;
  v1::TransferSpec spec;  // block ids and grant tokens stripped
  engine::PriorityClass priority = engine::PriorityClass::kNormal;
  v1::Path path = v1::PATH_UNSPECIFIED;
  std::string path_reason;
  engine::Engine* engine = nullptr;  // not owned
  std::optional<absl::Time> deadline;
  // spec.layerwise or spec.ready_flags: tiles are handed over layer by layer.
  bool layerwise = false;
  bool inbound = false;
  std::string link;
};

// The sessions a record answers to (0: none), kept after its regions are released. Immutable:
// read from any thread without a lock.
struct Owners {
  uint64_t src = 0;      // the source region's
  uint64_t dst = 0;      // the destination region's
  uint64_t arrival = 0;  // the arrival-flag region's
  // An inbound transfer's destination owner, which may read its status (0 for local ones).
  uint64_t inbound_dst = 0;
  // The producer whose readiness the transfer waits on (RecordParams.readiness_session).
  uint64_t readiness = 0;
  // Whether `session` (not 0) owns memory the transfer writes.
  bool WritesRegionOf(uint64_t session) const {
    return session != 0 && (dst == session || arrival == session);
  }
};

// Tile and layer accounting: what was handed to the engine, what reported, what landed. Not
// thread-safe: the owning Record guards it with its lock (Record::mu_).
class Progress {
 public:
  // Counts the plan's tiles per layer; `class_slot` and `link_slot` are the Counters' byte slots.
  Progress(const planner::Plan& plan, std::atomic<uint64_t>* class_slot,
           std::atomic<uint64_t>* link_slot);

  // Each hands tiles to the engine, counted as enqueued: every tile (bulk); the tiles of layers
  // not yet ready, marking every layer ready (the GPU-side gate); the tiles of transfer layers
  // [first, first + count) not yet ready.
  std::vector<uint32_t> EnqueueAll(const planner::Plan& plan);
  std::vector<uint32_t> EnqueueGated(const planner::Plan& plan);
  std::vector<uint32_t> EnqueueLayers(const planner::Plan& plan, uint32_t first, uint32_t count);
  bool gated() const { return gated_; }
  bool AllLayersReady() const;

  // Counts one report (done, failed or removed); false when none is expected (every enqueued
  // tile has reported), and then nothing is counted.
  bool TakeReport();
  // Counts every tile not yet reported as dropped (an inbound record ending), else at most
  // `removed` of them (taken off the engine's queue).
  void DropUnreported(bool all, size_t removed);
  bool AllReported() const { return tiles_reported_ >= tiles_enqueued_; }
  // A tile landed: counts its bytes (here and in the Counters' slots). Returns whether its layer
  // is complete now.
  bool Land(const planner::TileInfo& info);
  // spec.digest: adds one tile's digests; `layer` is its source layer.
  void AddDigest(uint32_t tile, uint32_t layer, uint64_t source, uint64_t destination);

  uint64_t bytes_done() const { return bytes_done_; }
  uint32_t tiles_done() const { return tiles_done_; }
  const std::vector<uint32_t>& layers_done() const { return layers_done_; }
  // The digest as TransferStatus.digest reports it (matched while nothing was checked).
  v1::IntegrityDigest digest() const;

 private:
  uint64_t bytes_done_ = 0;
  uint32_t tiles_done_ = 0;
  uint32_t tiles_enqueued_ = 0;
  uint32_t tiles_reported_ = 0;  // done, failed or removed from the queue
  std::vector<uint32_t> layer_tiles_left_;
  std::vector<bool> layer_ready_;
  std::vector<uint32_t> layers_done_;  // in completion order
  bool gated_ = false;                 // handed to the engine's GPU-side wait
  // Sums and the first (lowest) mismatching tile so far.
  v1::IntegrityDigest digest_;
  // The Counters' tile-by-tile byte slots for the record's path and priority, and its link(s) (a
  // tile's bytes are split evenly over them).
  std::atomic<uint64_t>* const class_slot_;
  std::vector<std::atomic<uint64_t>*> link_slots_;
};

// Where a record is in its life: its state, the end asked of it, and who waits for the end. Not
// thread-safe: the owning Record guards it with its lock (Record::mu_).
struct Lifecycle {
  v1::TransferState state = v1::TRANSFER_STATE_QUEUED;
  // Grows with every change, so watchers can wait for "anything new".
  uint64_t version = 0;
  std::optional<absl::Status> end_request;
  // The session making the layers ready ended: pending GPU waits are released.
  bool producer_gone = false;
  // Each with the detail of the status it is given.
  std::vector<std::pair<std::function<void(const v1::TransferStatus&)>, StatusDetail>> when_ended;
  size_t when_ended_counted = 0;  // of them, callers' (Record::kMaxWhenEnded)

  bool final() const { return state >= v1::TRANSFER_STATE_SUCCEEDED; }
  // Neither ended nor asked to end.
  bool open() const { return !end_request.has_value() && !final(); }
  // The state to end in once every tile has landed or every enqueued one has reported after an
  // end request; none while the record must go on.
  std::optional<v1::TransferState> FinalState(bool all_landed, bool all_reported) const;
};

// When and where the transfer ran, as its status reports it. Not thread-safe: the owning Record
// guards it with its lock (Record::mu_).
struct Timeline {
  int64_t received_us = 0;  // the Submit's arrival (0: unknown)
  int64_t submitted_us = 0;
  int64_t started_us = 0;  // the first tile's start
  int64_t finished_us = 0;
  std::vector<std::string> nics;
  // The engine's name, refined by OnEngineUsed ("cuda-kernel", "cuda-kernel+cuda-copy-engine").
  std::string engine_name;
  // The engine's note (OnEngineNote), appended to the path reason in the status.
  std::string engine_note;
};

}  // namespace record

// Thread-safe: every mutable part is guarded by mu_ (its lifecycle, progress, timeline and flag
// words). The lifecycle's version grows with every change so watchers can wait for "anything
// new". Once the record has ended (a final state), tile reports
// change nothing: a late report is ignored, never counted.
class Record final : public InboundJob {
 public:
  Record(planner::Plan plan, RecordParams params);
  ~Record() override;

  uint64_t id() const { return resolution_.id; }
  const std::optional<absl::Time>& deadline() const { return resolution_.deadline; }
  bool layerwise() const { return resolution_.layerwise; }
  // NICs carrying a fabric transfer (TransferStatus.nics).
  void SetNics(std::vector<std::string> nics);
  // Calls `done` with the final status (as much as `detail` says) once the transfer ends (at
  // once, on this thread, when it already has). `done` runs under the record's lock on whichever
  // thread ends the transfer: it must be quick, must not block and must not call back into the
  // record. At most kMaxWhenEnded are kept per transfer (RESOURCE_EXHAUSTED beyond: `done` is not
  // kept); the manager's own bookkeeping (`counted` false: at most one or two per record) is not
  // counted, so clients still get all kMaxWhenEnded.
  static constexpr size_t kMaxWhenEnded = 4096;
  absl::Status WhenEnded(std::function<void(const v1::TransferStatus&)> done, bool counted = true,
                         StatusDetail detail = StatusDetail::kWhole);
  // The engine that runs the record's tiles.
  engine::Engine* engine() const { return resolution_.engine; }
  bool inbound() const { return resolution_.inbound; }
  // The submitting session (spec.session_id; 0: anonymous, and for inbound transfers, whose
  // submitter is on another node).
  uint64_t submitter_session() const { return resolution_.spec.session_id(); }
  // The session owning an inbound transfer's destination, which may read its status (0: none,
  // and for transfers submitted here).
  uint64_t dst_owner_session() const { return owners_.inbound_dst; }
  // The session owning the source region (0: none, and for inbound transfers, whose source is on
  // another node): the producer of a pull, which may mark its layers ready.
  uint64_t src_owner_session() const { return owners_.src; }
  // Whether `session` (not 0) owns memory the transfer writes: its destination or arrival-flag
  // region. When that session ends the transfer ends too (EndSession): nothing is written into
  // the memory of an ended session.
  bool WritesRegionOf(uint64_t session) const { return owners_.WritesRegionOf(session); }
  // Whether the transfer has not ended and some of its layers are not ready yet (layer-wise
  // only): once the source's owner ended, nobody vouches for those layers' bytes (EndSession).
  // A transfer whose every layer was ready reads final bytes and may finish.
  bool AwaitsLayers() const;
  // Whether the transfer has not ended and waits for a layer `session` must make ready: it is
  // the producer (MarkReady by the submitter, or spec.ready_flags in its region).
  bool WaitsOn(uint64_t session) const;
  // spec.dst.node_id: the peer an outbound fabric transfer writes to ("" or this node: local).
  const std::string& spec_dst_node() const { return resolution_.spec.dst().node_id(); }

  // job::Job
  const planner::Plan& plan() const override { return plan_; }
  const uint8_t* src_base() const override { return src_->data(); }
  uint8_t* dst_base() const override { return dst_->data(); }
  void OnEngineNote(absl::string_view note) override;
  job::PriorityClass priority() const override { return resolution_.priority; }
  void OnTileStart(uint32_t tile) override;
  void OnTileDone(uint32_t tile, const absl::Status& status) override;
  // spec.digest: the engines' per-tile digests, summed into TransferStatus.digest.
  bool wants_digest() const override { return resolution_.spec.digest(); }
  void OnTileDigest(uint32_t tile, uint64_t source, uint64_t destination) override;
  bool MayGetMoreTiles() const override { return resolution_.layerwise && !IsFinal(); }
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
    // spec.done_word: its device address on GPU `accessor` from the region's mapping.
    std::optional<job::DoneWord> done_word(int accessor) const override {
      return record_->DoneWordFor(accessor);
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
  std::optional<job::DoneWord> DoneWordFor(int accessor) const;
  void EngineUsed(absl::string_view engine);
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the record's hold on its regions (and arrival flags); idempotent.
  void ReleaseRegionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillStatusLocked(v1::TransferStatus* status,
                        StatusDetail detail = StatusDetail::kWhole) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const record::Resolution resolution_;
  const record::Owners owners_;
  // Its block tables are freed when the transfer ends (no tile runs then; engines use only the
  // header afterwards). Everything else is immutable after construction.
  planner::Plan plan_;
  // Dropped when the transfer ends, under mu_ (so an unregistered region's memory, e.g. a CUDA
  // IPC mapping, is released then, not when the record leaves the history). Engines read them
  // without the lock only while tiles of the record run, which ends before the final state.
  std::shared_ptr<regions::Region> src_;
  std::shared_ptr<regions::Region> dst_;
  const std::shared_ptr<Counters> counters_;
  Clock* const clock_;
  mutable Sides sides_{this};

  mutable absl::Mutex mu_;
  record::Lifecycle life_ ABSL_GUARDED_BY(mu_);
  record::Progress progress_ ABSL_GUARDED_BY(mu_);
  record::Timeline timeline_ ABSL_GUARDED_BY(mu_);
  // Kept mapped until the transfer ends.
  ResolvedFlags arrival_ ABSL_GUARDED_BY(mu_);
  ResolvedFlags ready_ ABSL_GUARDED_BY(mu_);
  ResolvedDoneWord done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail::transfers
