// Transfers: accepts requests, plans them, hands tiles to an engine, tracks progress, deadlines,
// cancellation and history, and serves waits and watches.
//
// All-or-error: a transfer is validated and planned before any tile is queued; once it reaches a
// final state no tile of it runs any more (a cancel or failure waits for running tiles to report).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/access/access.h"
#include "daemon/engine/engine.h"
#include "daemon/handover/state.pb.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "daemon/sessions/sessions.h"
#include "daemon/transfers/engine_registry.h"
#include "daemon/transfers/notifications.h"
#include "daemon/transfers/remote_path.h"
#include "daemon/transfers/status_detail.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/topology.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::transfers {

struct Options {
  // Transfers whose spec.dst.node_id names another node go here (nullptr: refused UNIMPLEMENTED).
  RemotePath* remote = nullptr;
  std::string node_id;
  // The node's topology, for GPU pair paths and their reasons.
  v1::TopologyDesc topology;
  v1::TopologyGraph topology_graph;
  uint64_t tile_bytes = 1 << 20;
  // Local transfers with block tables of at least this many ids (both sides) are accepted once
  // their ids are copied; the engine checks the ids as tiles start (planner::Plan::CheckTiles),
  // and a bad id fails the transfer then, with the same INVALID_ARGUMENT message, before any tile
  // that reads it runs. 0: all checked before the submit is answered.
  uint64_t defer_id_checks_from = 32768;
  uint32_t history = 10000;
  // Caps (docs/security.md, "Caps"; DaemonConfig fields of the same names): a submit beyond
  // max_transfers_per_session transfers of its session not yet ended (the anonymous callers
  // share one count) is RESOURCE_EXHAUSTED naming the cap; a List limit above max_list_transfers
  // is RESOURCE_EXHAUSTED naming `limit`.
  uint32_t max_transfers_per_session = 4096;
  uint32_t max_list_transfers = 1000;
  // Prepared transfers one session holds at once (Prepare: RESOURCE_EXHAUSTED naming
  // max_prepared_per_session beyond).
  uint32_t max_prepared_per_session = 1024;
  // Called with the end of every transfer that ends (StatusDetail::kEnd: the end's fields and the
  // spec's priority; metrics, the log line); may be empty.
  std::function<void(const v1::TransferStatus&)> on_finished;
  // How often shared-memory ready flags (spec.ready_flags) are polled when none changed.
  absl::Duration flag_poll_interval = absl::Microseconds(20);
  // Where spec.notification is delivered when a transfer ends (notifications.h says to whom).
  // nullptr: notifications are accepted (and checked) but delivered to nobody. Not owned.
  NotificationHub* notifications = nullptr;
};

// What List returns: transfers matching every set filter (ListTransfersRequest's fields).
struct ListFilter {
  std::vector<v1::TransferState> states;  // empty: all
  uint32_t limit = 0;                     // 0: 100
  uint64_t region_id = 0;                 // either side, regions of this node only; 0: any
  std::string label;                      // exact; empty: any
  std::string idempotency_key;            // exact; empty: any
  uint64_t session_id = 0;                // the submitting session; 0: any
};

class Record;

// One watcher's place in a transfer's events (TransferManager::WatchStep): start with a default
// cursor. Owned by one watcher; not thread-safe.
struct WatchCursor {
  std::shared_ptr<Record> record;  // set by the first step (the snapshot)
  uint64_t version = 0;            // the record's change count last looked at
  v1::TransferState state = v1::TRANSFER_STATE_UNSPECIFIED;
  uint64_t bytes = 0;          // bytes_done last sent
  bool bytes_pending = false;  // bytes moved since, not sent yet (min_interval)
  size_t layers_sent = 0;
  absl::Time last_progress;  // by the manager's clock
  bool over = false;         // the final state's event was produced: the stream ends
};

// Thread-safe. Destroy only after the engine has stopped reporting (drain first).
//
// Access (docs/security.md): every call names its caller and is checked here, whichever front
// door it came through (gRPC, the session socket), and denied unless a rule allows it:
// - Submit: spec.session_id is the submitter (the front door sets it from the caller's
//   credentials); it must own every region the spec names or hold a grant for it.
// - reading a transfer (Get, Wait, WhenEnded, Watch): its submitting session, the owner of the
//   destination of a transfer another node writes into this one, and the operator
//   (Caller::operator_role);
// - MarkReady: its submitting session and the owner of its source region (a pull's producer);
// - Cancel: its submitting session, the owner of a region it uses by a grant (which may stop
//   another's use of its memory at any time, as revoking the grant does), and root from a
//   session that owns no regions (the CLI; an audit line);
// - List: the operator lists every transfer, anyone else those its session submitted
//   (anonymous callers none).
// A refusal names transfer_id. It is NOT_FOUND for an unknown id and, with the same message, for
// a caller with no part in the transfer (another tenant's id looks exactly like a nonexistent
// one); a party to it (a reader, the owner of a region it uses by a grant, its source's owner)
// that may not do this gets PERMISSION_DENIED saying who may. Anonymous callers submit nothing
// they could come back to.
class TransferManager : public InboundSink {
 public:
  virtual ~TransferManager() = default;
  // Local transfers run on `engines` (engine_registry.h): host-to-host ones on the first that
  // moves host memory, the rest on the first that moves GPU memory (daemon/scheduler/route.h).
  // `grants` decides who may use a region (the manager hooks its access changes: create the
  // manager before sessions end).
  static std::unique_ptr<TransferManager> Create(regions::RegionTable* regions,
                                                 access::Grants* grants, EngineRegistry engines,
                                                 Clock* clock, const Options& options);

  // Accepts a transfer submitted by session spec.session_id (see the class comment).
  virtual absl::StatusOr<v1::SubmitTransferResponse> Submit(const v1::TransferSpec& spec) = 0;
  // Submit for callers that must not wait on another daemon (the session socket's poll thread):
  // a destination on another node is refused with FAILED_PRECONDITION naming spec.dst.node_id.
  virtual absl::StatusOr<v1::SubmitTransferResponse> SubmitWithinNode(
      const v1::TransferSpec& spec) = 0;
  // --- Prepared transfers (a shape validated and planned once, posted many times) ---
  // Validates `request.spec` (no block ids; see PrepareTransferRequest) as Submit would for
  // `caller`'s session (regions, grants, layouts, layers, heads, route) and plans its shape once
  // (planner::PlanTemplate). The prepared id is the session's alone; anonymous callers are
  // refused (PERMISSION_DENIED naming session_id), a session holding
  // Options::max_prepared_per_session already RESOURCE_EXHAUSTED naming that cap. It ends with
  // ReleasePrepared, the session's end (EndSession), or the unregistration of either region.
  virtual absl::StatusOr<v1::PrepareTransferResponse> Prepare(
      const sessions::Caller& caller, const v1::PrepareTransferRequest& request) = 0;
  // One transfer of prepared shape `post.prepared_id` with the post's ids, answered and admitted
  // as Submit's. Checked on every post: the ids (planner::PlanTemplate::Instantiate, errors
  // naming "post.src_block_ids[i]"), that both regions are still registered and every grant the
  // shape uses still holds (as Submit's errors, naming spec.src / spec.dst), the post's done
  // word, the caps and draining. NOT_FOUND naming prepared_id for an unknown id and, with the
  // same message, another session's (deny by default: ids cannot be probed).
  virtual absl::StatusOr<v1::SubmitTransferResponse> Post(const sessions::Caller& caller,
                                                          const v1::PostTransferRequest& post) = 0;
  // Frees the caller's prepared transfer (transfers posted from it run on). NOT_FOUND as Post.
  virtual absl::Status ReleasePrepared(const sessions::Caller& caller, uint64_t prepared_id) = 0;
  virtual absl::StatusOr<v1::TransferStatus> Get(const sessions::Caller& caller,
                                                 uint64_t id) const = 0;
  // Returns when the transfer ends or after `timeout` (the current status then).
  virtual absl::StatusOr<v1::TransferStatus> Wait(const sessions::Caller& caller, uint64_t id,
                                                  absl::Duration timeout) const = 0;
  // Calls `done` with the final status when the transfer ends (at once when it has), on the
  // thread that ends it; `done` must be quick and must not block or call into the manager.
  // NOT_FOUND for an unknown id, RESOURCE_EXHAUSTED when the transfer has thousands of waiters
  // already (then `done` is never called). `counted` false is for the daemon's own followers (a
  // session's completion queue: one per transfer, from its submitter), which do not take a
  // client's place under that cap. `detail` kEnd gives `done` the end's fields only
  // (status_detail.h), without the copy of the spec: what a completion queue's entry needs.
  virtual absl::Status WhenEnded(const sessions::Caller& caller, uint64_t id,
                                 std::function<void(const v1::TransferStatus&)> done,
                                 bool counted = true,
                                 StatusDetail detail = StatusDetail::kWhole) const = 0;
  // Calls `sink` with a snapshot, then with every event until the final state. Stops early, OK,
  // when `sink` returns false, or `still_wanted` (if set; asked at least every 100 ms, also while
  // nothing happens) returns false: the watcher went away.
  virtual absl::Status Watch(const sessions::Caller& caller, uint64_t id,
                             absl::Duration min_interval,
                             const std::function<bool(const v1::TransferEvent&)>& sink,
                             const std::function<bool()>& still_wanted = nullptr) const = 0;
  // Watch without waiting, for watchers driven by completions (the gRPC server's watch pump): the
  // first step checks that `caller` may read the transfer and appends the snapshot, each later
  // one the events Watch would have sent since (none while nothing changed), and sets
  // cursor->over with the final state's. Costs one lock of the transfer's record while nothing
  // changed. Refusals (first step) as Get's.
  virtual absl::Status WatchStep(const sessions::Caller& caller, uint64_t id,
                                 absl::Duration min_interval, WatchCursor* cursor,
                                 std::vector<v1::TransferEvent>* events) const = 0;
  virtual absl::StatusOr<v1::TransferStatus> Cancel(const sessions::Caller& caller,
                                                    uint64_t id) = 0;
  virtual absl::Status MarkReady(const sessions::Caller& caller, uint64_t id, uint32_t layer_begin,
                                 uint32_t layer_count) = 0;
  // Newest first, of the transfers `caller` may list; `states` empty means all.
  virtual std::vector<v1::TransferStatus> List(const sessions::Caller& caller,
                                               const std::vector<v1::TransferState>& states,
                                               uint32_t limit) const = 0;
  // Newest first, the transfers matching `filter` (at most filter.limit of them) of those
  // `caller` may list. RESOURCE_EXHAUSTED naming `limit` above Options::max_list_transfers.
  virtual absl::StatusOr<std::vector<v1::TransferStatus>> ListChecked(
      const sessions::Caller& caller, const ListFilter& filter) const = 0;
  virtual std::vector<v1::TransferStatus> List(const sessions::Caller& caller,
                                               const ListFilter& filter) const = 0;
  // Session `session_id` ended (the region table's session-end hook). The transfers waiting for
  // readiness only it could give - layer-wise ones it submitted (only the submitter may mark
  // layers ready) and those whose spec.ready_flags live in its regions - end at once, ABORTED,
  // when some of their layers were not ready yet. Others go on (they hold their regions).
  virtual void EndSession(uint64_t session_id) = 0;
  virtual void FillStats(v1::Stats* stats) const = 0;
  // Fails transfers whose deadline has passed (by the injected clock). A background thread calls
  // it; tests may call it directly.
  virtual void CheckDeadlines() = 0;
  // --- Hot restart (daemon/handover) ---
  // Waits until no transfer of this manager is running (their submitters' waits are answered
  // as they end) or `timeout` passes: then FAILED_PRECONDITION naming how many still run (the
  // caller keeps serving; nothing is refused or failed here). The caller holds new submits back.
  virtual absl::Status Quiesce(absl::Duration timeout) = 0;
  // The ended transfers (newest first) and the next transfer id, for a successor that answers
  // questions about them (Get, Wait, WhenEnded, Authorize).
  virtual void ExportState(handover::TransferState* out) const = 0;
  // Before the first submit: takes a predecessor's ended transfers (answered as the
  // predecessor would: same status, same submitter) and continues its ids.
  virtual void ImportState(const handover::TransferState& state) = 0;
  // Refuses new transfers, lets running ones finish for up to `timeout`, then fails the rest with
  // UNAVAILABLE and waits until none of their tiles runs.
  virtual void Drain(absl::Duration timeout) = 0;
};

}  // namespace kvrail::transfers
