// Internal to the transfers module: the TransferManager implementation, declared here so its
// parts can live in small files: admission (transfer_manager.cc), requests about admitted
// transfers (observe.cc) and the receiving side of the fabric (inbound.cc).
//
// A submit walks: Resolve (resolve.h: regions, ids, flags) -> plan -> route -> Admit (id,
// record, counters, history, watches, enqueue) -> engine -> the record's completion.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/planner/parallel_table_checks.h"
#include "daemon/transfers/flag_watches.h"
#include "daemon/transfers/grant_uses.h"
#include "daemon/transfers/history.h"
#include "daemon/transfers/prepared.h"
#include "daemon/transfers/record.h"
#include "daemon/transfers/resolve.h"
#include "daemon/transfers/transfers.h"

namespace kvrail::transfers {

// The "engine" of inbound fabric transfers: their tiles are written by the fabric's unpack
// threads, which report them to the record directly; nothing is queued here. Ending such a
// record drops every tile that has not landed (Record::RequestEnd counts them under the record's
// lock), so Remove removes nothing here. Thread-safe (stateless).
class InboundEngine final : public engine::Engine {
 public:
  std::string name() const override { return "fabric-receiver"; }
  engine::Capabilities capabilities() const override { return engine::Capabilities(); }
  void Enqueue(const std::shared_ptr<engine::Job>&, const std::vector<uint32_t>&) override {}
  size_t Remove(const engine::Job*) override { return 0; }
  std::vector<uint64_t> QueuedTiles() const override {
    return std::vector<uint64_t>(engine::kNumPriorityClasses, 0);
  }
  std::string Describe() const override { return "fabric-receiver"; }
};

// The answer for a transfer id this daemon does not know (NOT_FOUND naming transfer_id). A caller
// with no part in a transfer gets exactly this for it too, so ids cannot be probed.
absl::Status UnknownTransfer(uint64_t id);

// TransferStatus.link for a local transfer: "host", "gpu0", "gpu0-gpu1", "gpu0-host", ...
std::string LinkName(const regions::Region& src, const regions::Region& dst);
// The region's memory kind and GPU (the route's input; no address).
job::Placement PlacementOf(const regions::Region& r);

// Thread-safe. mu_ guards the history, the id counter and the draining flag; lock order:
// mu_, then a record's lock. Engines, the remote path and flag watches are called outside mu_.
class TransferManagerImpl final : public TransferManager {
 public:
  TransferManagerImpl(regions::RegionTable* regions, access::Grants* grants, EngineRegistry engines,
                      Clock* clock, const Options& options);
  ~TransferManagerImpl() override;

  // TransferManager (transfer_manager.cc)
  absl::StatusOr<v1::SubmitTransferResponse> Submit(const v1::TransferSpec& spec) override;
  // Submit's work; Submit counts what it refuses (Stats.rejected_by_code).
  absl::StatusOr<v1::SubmitTransferResponse> SubmitCounted(const v1::TransferSpec& spec);
  void CountRejected(const absl::Status& status);
  absl::StatusOr<v1::SubmitTransferResponse> SubmitWithinNode(
      const v1::TransferSpec& spec) override;
  void CheckDeadlines() override;
  void Drain(absl::Duration timeout) override;
  // (inherited.cc)
  absl::Status Quiesce(absl::Duration timeout) override;
  void ExportState(handover::TransferState* out) const override;
  void ImportState(const handover::TransferState& state) override;
  // (observe.cc)
  absl::StatusOr<v1::TransferStatus> Get(const sessions::Caller& caller,
                                         uint64_t id) const override;
  absl::StatusOr<v1::TransferStatus> Wait(const sessions::Caller& caller, uint64_t id,
                                          absl::Duration timeout) const override;
  absl::Status WhenEnded(const sessions::Caller& caller, uint64_t id,
                         std::function<void(const v1::TransferStatus&)> done, bool counted = true,
                         StatusDetail detail = StatusDetail::kWhole) const override;
  absl::Status Watch(const sessions::Caller& caller, uint64_t id, absl::Duration min_interval,
                     const std::function<bool(const v1::TransferEvent&)>& sink,
                     const std::function<bool()>& still_wanted) const override;
  absl::Status WatchStep(const sessions::Caller& caller, uint64_t id, absl::Duration min_interval,
                         WatchCursor* cursor,
                         std::vector<v1::TransferEvent>* events) const override;
  absl::StatusOr<v1::TransferStatus> Cancel(const sessions::Caller& caller, uint64_t id) override;
  absl::Status MarkReady(const sessions::Caller& caller, uint64_t id, uint32_t layer_begin,
                         uint32_t layer_count) override;
  std::vector<v1::TransferStatus> List(const sessions::Caller& caller,
                                       const std::vector<v1::TransferState>& states,
                                       uint32_t limit) const override;
  std::vector<v1::TransferStatus> List(const sessions::Caller& caller,
                                       const ListFilter& filter) const override;
  void FillStats(v1::Stats* stats) const override;
  // InboundSink (inbound.cc)
  absl::StatusOr<Admitted> BeginInbound(const v1::TransferSpec& spec, const planner::Plan& plan,
                                        std::shared_ptr<regions::Region> source,
                                        std::shared_ptr<regions::Region> dst,
                                        const std::string& sender_node,
                                        uint64_t sender_transfer_id) override;
  void EndInbound(uint64_t id, const absl::Status& why) override;
  void PeerLost(const std::string& node_id, const absl::Status& why) override;
  absl::StatusOr<std::vector<v1::TransferStatus>> ListChecked(
      const sessions::Caller& caller, const ListFilter& filter) const override;
  void EndSession(uint64_t session_id) override;
  // (prepared.cc)
  absl::StatusOr<v1::PrepareTransferResponse> Prepare(
      const sessions::Caller& caller, const v1::PrepareTransferRequest& request) override;
  absl::StatusOr<v1::SubmitTransferResponse> Post(const sessions::Caller& caller,
                                                  const v1::PostTransferRequest& post) override;
  absl::Status ReleasePrepared(const sessions::Caller& caller, uint64_t prepared_id) override;

 private:
  // Post's work; Post counts what it refuses (Stats.rejected_by_code).
  absl::StatusOr<v1::SubmitTransferResponse> PostCounted(const sessions::Caller& caller,
                                                         const v1::PostTransferRequest& post);
  // What a caller does with an admitted transfer (the rules: TransferManager's class comment).
  enum class Use {
    kRead,     // Get, Wait, WhenEnded, Watch
    kControl,  // MarkReady
    kCancel,   // Cancel (the operator's own rule is Cancel's)
  };
  // The record of transfer `id` if `caller` may `use` it: NOT_FOUND (UnknownTransfer) for
  // unknown ids and for a caller with no part in the transfer, else PERMISSION_DENIED naming
  // transfer_id.
  absl::StatusOr<std::shared_ptr<Record>> Authorized(uint64_t id, const sessions::Caller& caller,
                                                     Use use) const;
  // `filter` limited to what `caller` may list; false when it may list nothing.
  static bool ListableBy(const sessions::Caller& caller, ListFilter* filter);
  std::vector<v1::TransferStatus> ListUnchecked(const ListFilter& filter) const;

  // An idempotency key held by one submit from before its checks until it is admitted or has
  // failed, so a concurrent submit with the same key waits for it and then answers with its
  // transfer instead of starting a second one. Frees the key on destruction unless admitted.
  // Thread-compatible: owned by the one submit; its destructor takes mu_.
  // The key is the caller's scoped to its session ("<session>/<key>"), held with the
  // fingerprint of the spec submitted under it.
  class KeyClaim {
   public:
    KeyClaim(TransferManagerImpl* owner, std::string key, uint64_t fingerprint = 0)
        : owner_(owner), key_(std::move(key)), fingerprint_(fingerprint) {}
    KeyClaim(KeyClaim&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)),
          key_(std::move(other.key_)),
          fingerprint_(other.fingerprint_) {}
    KeyClaim& operator=(KeyClaim&&) = delete;
    ~KeyClaim();
    const std::string& key() const { return key_; }
    uint64_t fingerprint() const { return fingerprint_; }

   private:
    TransferManagerImpl* owner_;  // null: nothing held
    std::string key_;
    uint64_t fingerprint_;
  };
  // The earlier transfer's answer when spec.idempotency_key names one of the same session
  // submitted with the same spec (ALREADY_EXISTS naming idempotency_key when its spec differed);
  // otherwise the key claimed for this submit. UNAVAILABLE while draining.
  struct Claimed {
    std::optional<v1::SubmitTransferResponse> earlier;
    KeyClaim claim;
  };
  absl::StatusOr<Claimed> ClaimKey(const v1::TransferSpec& spec);

  // Transfers not yet ended per submitting session (Options::max_transfers_per_session).
  // Thread-safe; shared with the records' end callbacks.
  struct InFlight {
    absl::Mutex mu;
    absl::flat_hash_map<uint64_t, uint32_t> by_session ABSL_GUARDED_BY(mu);
    void Give(uint64_t session) {
      absl::MutexLock lock(&mu);
      auto it = by_session.find(session);
      if (it != by_session.end() && --it->second == 0) by_session.erase(it);
    }
  };
  // One session's place among its transfers in flight, given back on destruction unless a
  // record took it over (Admit: given back when the record ends). Thread-compatible.
  class InFlightSlot {
   public:
    InFlightSlot(std::shared_ptr<InFlight> counts, uint64_t session)
        : counts_(std::move(counts)), session_(session) {}
    InFlightSlot(InFlightSlot&& other) noexcept
        : counts_(std::move(other.counts_)), session_(other.session_) {}
    InFlightSlot& operator=(InFlightSlot&&) = delete;
    ~InFlightSlot() {
      if (counts_ != nullptr) counts_->Give(session_);
    }
    // Hands the place to `record`: given back when it ends.
    void HandTo(Record& record);

   private:
    std::shared_ptr<InFlight> counts_;  // null: handed over
    uint64_t session_;
  };
  // RESOURCE_EXHAUSTED naming max_transfers_per_session when the session is at the cap.
  absl::StatusOr<InFlightSlot> TakeInFlight(uint64_t session);
  absl::StatusOr<v1::SubmitTransferResponse> SubmitCapped(const v1::TransferSpec& spec);

  // What Admit needs besides the plan and the record's fields.
  struct Admission {
    const KeyClaim* claim = nullptr;       // null: no idempotency key
    InFlightSlot* in_flight = nullptr;     // handed to the record once admitted; null: not counted
    const ResolvedFlags* ready = nullptr;  // producer flags to watch, if set
    uint32_t first_layer = 0;              // the source layer ready word 0 stands for
    // Runs once the record exists, before it is admitted (the remote path announces it to the
    // peer); an error abandons the transfer. After it succeeded the record is admitted even if a
    // drain began meanwhile (the drain then ends it like any other).
    std::function<absl::Status(const std::shared_ptr<Record>&)> before_admit;
    // Notification (spec.notification): the submitting session, never notified (0: unknown),
    // and the node and transfer id the notification names as the submitter's (empty / 0: this
    // node and the record's id).
    uint64_t submitter_session = 0;
    std::string submitter_node;
    uint64_t submitter_transfer_id = 0;
  };
  // The one admission of local, remote and inbound transfers: id, record, counters, history
  // (deadline and idempotency indexes), flag watch, and the initial tiles queued on the record's
  // engine. UNAVAILABLE while draining.
  absl::StatusOr<std::shared_ptr<Record>> Admit(planner::Plan plan, RecordParams params,
                                                const Admission& admission);
  // The route between two placements and the engine of this daemon that runs it, for submits
  // and prepares alike: FAILED_PRECONDITION when no engine moves it, or when `digest` is asked of
  // an engine that does not hash tiles (the refusal advises to `verb` it without digest).
  struct Routed {
    scheduler::Route route;
    engine::Engine* engine = nullptr;
  };
  absl::StatusOr<Routed> RouteAndEngine(const job::Placement& src_at, const job::Placement& dst_at,
                                        bool digest, absl::string_view verb);
  absl::StatusOr<v1::SubmitTransferResponse> SubmitLocal(const ResolvedRequest& request,
                                                         int64_t received_us, const KeyClaim& claim,
                                                         InFlightSlot* slot);
  absl::StatusOr<v1::SubmitTransferResponse> SubmitRemote(const ResolvedRequest& request,
                                                          const KeyClaim& claim,
                                                          InFlightSlot* slot);
  static v1::SubmitTransferResponse Accepted(uint64_t id, const planner::Plan& plan,
                                             bool deduplicated);
  // Arranges spec.notification's delivery when `record` ends (a no-op without one or a hub).
  void NotifyWhenEnded(const std::shared_ptr<Record>& record, const Admission& admission,
                       std::vector<NotificationRecipient> recipients);
  // An admitted transfer's end: its queued tiles leave the engine; running ones still report.
  void End(const std::shared_ptr<Record>& record, const absl::Status& why);
  absl::StatusOr<std::shared_ptr<Record>> Find(uint64_t id) const;
  uint64_t ActiveCount() const;
  void DeadlineLoop();

  regions::RegionTable* const regions_;
  access::Grants* const grants_;
  const EngineRegistry engines_;
  InboundEngine inbound_engine_;
  Clock* const clock_;
  const Options options_;
  const std::shared_ptr<Counters> counters_;
  const std::vector<int> gpu_index_;  // CUDA ordinal -> topology GPU index
  // Large block tables are copied and checked on two threads (both paths' plans).
  const std::unique_ptr<planner::TableCheckRunner> table_checks_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_);
  // Transfers that ended in a predecessor (ImportState), answered by id.
  absl::flat_hash_map<uint64_t, handover::EndedTransfer> inherited_ ABSL_GUARDED_BY(mu_);
  // The inherited transfer `id`, if any (a copy).
  std::optional<handover::EndedTransfer> FindInherited(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Authorize for an inherited transfer (the same rules, from its recorded sessions).
  static absl::Status AuthorizeInherited(const handover::EndedTransfer& ended,
                                         const sessions::Caller& caller, Use use);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  History history_ ABSL_GUARDED_BY(mu_);
  FlagWatches watches_;
  // Transfers moving bytes on a grant: ended when it ends (the region table's access hook, the
  // deadline loop for expiry). Shared with the hook, which may outlive the manager.
  const std::shared_ptr<GrantUses> grant_uses_;
  const std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
  // Prepared transfers. Shared with the region table's unregister hook, which may outlive the
  // manager.
  const std::shared_ptr<PreparedTable> prepared_;
  std::thread deadline_thread_;
};

}  // namespace kvrail::transfers
