// The session socket's daemon end: gRPC cannot carry file descriptors, so clients pass memfds
// here, and submit and wait for transfers within the node in one round trip. The protocol (packet
// formats, descriptor passing, limits) is wire/session_wire.h, shared with the client library.
// A token is single-use and belongs to its session (RegisterRegion.session_id). When the client
// closes the connection, or dies, the session ends and its regions are unregistered.
// The greeting names the daemon's instance (NewInstanceId, also Stats.instance_id): when this
// daemon stops or dies every connection closes, and a client that connects again sees another
// instance; either tells the client its session and regions are gone ("session lost").
//
// SUBMIT is the same operation as the SubmitTransfer RPC (same validation, same errors naming the
// field), one socket round trip instead of gRPC's: on these VMs a unix-socket round trip costs
// ~37 us and a unary gRPC call ~165 us, which a 16 MiB layer (~50 us of NVLink) cannot afford.
// It serves transfers within this node only (a transfer to another node would block the poll
// thread on the peer): those are refused with FAILED_PRECONDITION naming spec.dst.node_id.
// WAIT is WaitTransfer without a timeout, answered by the thread that ends the transfer (the
// poll thread never blocks): a connection with a WAIT pending is busy until DONE arrives; a
// client that closes it meanwhile gets nothing, and nothing else is disturbed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/predictive_wake.h"
#include "base/unique_fd.h"
#include "daemon/handover/state.pb.h"
#include "daemon/sessions/sessions.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::session {

// A new daemon instance id: 128 random bits as 32 lowercase hex digits. Thread-safe.
std::string NewInstanceId();

// What a session server serves and its caps (docs/security.md, "Caps").
struct SessionServerOptions {
  // The socket path (a file there is replaced); the socket is bound in a private directory and
  // renamed there with `mode`, so it never exists at the path with the umask's permissions.
  std::string path;
  uint32_t mode = 0660;
  // Greetings name it (none when empty).
  std::string instance_id;
  // Accepts a SUBMIT (on an admission worker or the poll thread, see admission_workers:
  // thread-safe); without one SUBMIT is refused (UNIMPLEMENTED).
  std::function<absl::StatusOr<v1::SubmitTransferResponse>(const v1::TransferSpec& spec)> submit;
  // Posts a prepared transfer for a POST packet (TransferManager::Post, `caller` the
  // connection's session), where and in the order a SUBMIT is admitted: thread-safe. Without
  // one POST is refused (UNIMPLEMENTED).
  std::function<absl::StatusOr<v1::SubmitTransferResponse>(const sessions::Caller& caller,
                                                           const v1::PostTransferRequest& post)>
      post;
  // WAIT by `caller` (the connection's session, or the session its credential names) for
  // transfer `id`: registers `done` for its end, or refuses as the transfer manager does
  // (NOT_FOUND for an unknown id and for a caller with no part in the transfer). `done` must not
  // block. Without one WAIT is refused (UNIMPLEMENTED).
  std::function<absl::Status(const sessions::Caller& caller, uint64_t id,
                             std::function<void(const v1::TransferStatus& status)> done)>
      wait;
  // CANCEL by `caller` (the connection's session) of transfer `id`: TransferManager::Cancel,
  // whose checks decide who may (a caller with no part in the transfer gets NOT_FOUND, as an
  // unknown id does). Served by an admission worker in the session's order of packets (the
  // poll thread with admission_workers 0), since ending a large transfer takes a while:
  // thread-safe, must not block. Without one CANCEL is refused
  // (UNIMPLEMENTED) and the client cancels over gRPC.
  std::function<absl::StatusOr<v1::TransferStatus>(const sessions::Caller& caller, uint64_t id)>
      cancel;
  // As `wait`, for the connection's completion queue: the daemon's own follower of a transfer
  // its connection submitted, not counted against the transfer's cap of waiters. Unset: `wait`.
  std::function<absl::Status(const sessions::Caller& caller, uint64_t id,
                             std::function<void(const v1::TransferStatus& status)> done)>
      follow;
  // Connections open at once, in all and per uid (SO_PEERCRED). A connection beyond either is
  // answered "REJECTED" RESOURCE_EXHAUSTED naming the cap (max_sessions, max_sessions_per_uid)
  // instead of a greeting, and closed.
  size_t max_sessions = 4096;
  size_t max_sessions_per_uid = 256;
  // WAITs pending at once per connection (DaemonConfig.max_watchers_per_session) and per uid
  // (DaemonConfig.max_watchers_per_uid). A WAIT is pending from its registration until its
  // transfer ends - for the uid's count also after its connection closed, since its `done` stays
  // with the transfer until then. Beyond either, the WAIT is answered REJECTED
  // RESOURCE_EXHAUSTED naming the cap. (Each transfer also keeps at most
  // transfers::Record::kMaxWhenEnded waiters.)
  size_t max_waits_per_connection = 64;
  size_t max_waits_per_uid = 1024;
  // Descriptors kept free below RLIMIT_NOFILE for the rest of the daemon (gRPC's listener and
  // connections, regions being mapped): a connection or a passed descriptor that arrives as a
  // number within this many of the limit is refused (RESOURCE_EXHAUSTED) and closed. When
  // accept itself fails for want of descriptors, a reserve descriptor is closed to take the
  // connection and refuse it, so the listener is never left readable and unserved.
  size_t fd_headroom = 64;
  // After each wake-up with work the poll thread keeps polling (epoll_wait without sleeping) this
  // long before it sleeps again: a client's next packet (the WAIT after a SUBMIT, the next
  // transfer) then costs no thread wake-up on the critical path. Zero: sleeps at once.
  absl::Duration spin = absl::ZeroDuration();
  // When set (tests), counts the polls the poll thread makes while spinning (none without `spin`).
  std::atomic<uint64_t>* spin_polls = nullptr;
  // Threads that admit SUBMITs (parse, validate, resolve, plan: `submit`) off the poll thread
  // (DaemonConfig.session_admission_workers): one session's large submit (a million-tile plan)
  // then delays neither the poll thread nor other sessions' submits, while each session's
  // packets are still answered in the order sent. 0: SUBMITs are admitted on the poll thread.
  size_t admission_workers = 4;
  // Threads, besides those, that admit the SUBMITs naming more than kBulkIds block ids
  // (daemon/session/admission.h; a shared block table's count included) at background CPU
  // priority (SCHED_IDLE; DaemonConfig.session_admission_bulk_workers): such a submit
  // (a million-id plan) then takes the CPU only when the other tenants' threads leave it. 0:
  // those SUBMITs go to the workers above at normal priority. Unused with admission_workers 0.
  // Started only where admission_bulk_deadline's guard can work (PlanBulkWorkers; a warning
  // names what is missing otherwise). 0 here (tests); the daemon's config defaults it to 1.
  size_t admission_bulk_workers = 0;
  // A bulk admission still running this long is lifted to normal priority for its rest
  // (DaemonConfig.session_admission_bulk_deadline_ms). Zero: never (unguarded).
  absl::Duration admission_bulk_deadline = absl::ZeroDuration();
  // A SUBMIT whose block ids travel in the packet, at most this many on both sides together (no
  // shared block table), is admitted on the poll thread when its session has nothing queued: its
  // admission costs no more than the hand-off to a worker (on an H100 host the hand-off added
  // 30-45 us to a 16 MiB transfer of 2 x 1,024 ids, whose admission there took 9-13 us), so it
  // delays other sessions by no more. 0: every SUBMIT goes to a worker.
  size_t max_inline_submit_ids = 4096;
  // Packets one session may have queued behind a SUBMIT not yet admitted; beyond, a packet is
  // answered REJECTED RESOURCE_EXHAUSTED at once. A session that closes has its queued packets
  // dropped unserved.
  size_t max_queued_per_session = 64;
  // Whether sessions may map a submission queue ("SQ", wire/submission_queue.h;
  // DaemonConfig.session_submission_queue). Its entries are admitted as SUBMIT packets are: the
  // same `submit`, the same per-session order through the admission workers, the connection's
  // session as the submitter; each is answered by an acknowledgement in the queue's ack ring.
  bool submission_queue = true;
  // After taking entries from a session's submission queue the poll thread keeps looking at it
  // for up to this long (adaptive: halved, down to an eighth, each time it finds nothing; back
  // to full on a hit, or when entries wake the queue within this long of the last spin's start)
  // with the queue's need_wake clear, so that the client's next batch costs
  // neither its eventfd write nor the poll thread's wake-up
  // (DaemonConfig.session_submission_spin_us). Zero: the poll thread sleeps at once and every
  // batch rings the eventfd.
  absl::Duration submission_spin = absl::ZeroDuration();
  // The share of one core the poll thread may spend in both spins above (`spin` and
  // `submission_spin`) waiting for nothing, as SpinBudget keeps it over a 100 ms window
  // (DaemonConfig.session_spin_budget_percent / 100): a spin that ends with the thread going to
  // sleep is drawn from it, one that found work (back-to-back traffic) is free; a spin ends early
  // once it would overdraw it. 1: no cap; 0: never spins.
  double spin_budget = 1.0;
  // A spin (either above) that found work - the next packet or submission, back-to-back traffic
  // - is free up to this long: only its part beyond is drawn from spin_budget
  // (DaemonConfig.session_spin_free_us). Back-to-back transfers then keep the poll thread awake
  // whatever the budget, at a cost of at most this much spinning per request served; a long spin
  // covering a cadence's gap is still paid from the budget. Zero: every spin is drawn.
  absl::Duration spin_free = absl::ZeroDuration();
  // When set (tests, stats): the time the poll thread spent spinning for nothing (the spins it
  // ended by going to sleep), in ns.
  std::atomic<uint64_t>* spin_spent_ns = nullptr;
  // Predictive wake (DaemonConfig.predictive_wake, base/predictive_wake.h): when the requests
  // come at a steady cadence, the poll thread sleeps (a timed epoll wait, its timer slack set to
  // 1 us) until the next predicted arrival less `wake.margin` and the overshoot it measured, then
  // spins - polls the sockets and every submission queue with need_wake clear - until
  // `wake.tolerance` past it, then sleeps as before. Irregular traffic, a miss or a pause: sleeps
  // as before. The spin is drawn whole from spin_budget (spin_free does not apply to it).
  bool predictive_wake = false;
  PredictiveWakeOptions wake;
  // When set (tests, stats): predicted spins begun, those that found the request, those that
  // ended without it (a miss: the thread slept as before).
  struct WakeCounts {
    std::atomic<uint64_t> spins{0};
    std::atomic<uint64_t> hits{0};
    std::atomic<uint64_t> misses{0};
  };
  WakeCounts* wake_counts = nullptr;
};

// Owns the listening socket, one poll thread (epoll: each wake-up costs what is ready, not
// what is open) and the admission workers (admission_workers). Thread-safe to destroy from any
// thread (stops the poll thread, lets running admissions finish and drops queued ones, closes
// every session, which ends them in the session table).
class SessionServer {
 public:
  virtual ~SessionServer() = default;

  // Accepts a transfer for a SUBMIT packet. Runs on an admission worker or, for a small SUBMIT
  // (max_inline_submit_ids), on the poll thread, for different sessions at once: thread-safe.
  using SubmitFn =
      std::function<absl::StatusOr<v1::SubmitTransferResponse>(const v1::TransferSpec& spec)>;

  // Registers `done` to be called with the final status when transfer `id` ends (at once when
  // it has); an error (NOT_FOUND) is answered at once. `done` must not block.
  using WaitFn = std::function<absl::Status(
      uint64_t id, std::function<void(const v1::TransferStatus& status)> done)>;

  // Binds `path` (an existing socket file there is replaced) with permission bits `mode`.
  // Greetings name `instance_id` (none when empty). Without `submit` / `wait`, SUBMIT / WAIT
  // packets are refused (UNIMPLEMENTED).
  static absl::StatusOr<std::unique_ptr<SessionServer>> Start(
      const std::string& path, uint32_t mode, sessions::SessionTable* sessions,
      const std::string& instance_id, SubmitFn submit = nullptr, WaitFn wait = nullptr);
  // The same, with the options above (the server this one starts is the same).
  static absl::StatusOr<std::unique_ptr<SessionServer>> Start(const SessionServerOptions& options,
                                                              sessions::SessionTable* sessions);
  virtual size_t active_sessions() const = 0;
  // Packets waiting for an admission worker, every session together (stats, tests).
  virtual size_t admissions_queued() const = 0;
  // The admission queues (metrics: kvrail_session_admission_*): tasks waiting in all, tasks
  // running, and the most waiting in one session's queue (max_queued_per_session bounds it).
  // Thread-safe.
  struct AdmissionDepth {
    size_t queued = 0;
    size_t running = 0;
    size_t deepest = 0;
    uint64_t promoted = 0;  // bulk admissions the guard lifted to normal priority, so far
  };
  virtual AdmissionDepth admission_depth() const = 0;

  // --- Hot restart (daemon/handover) ---
  // A predecessor's listener and connections (their sessions already imported into `sessions`),
  // with their completion queues; descriptors are taken out of `fds` by the state's indices.
  // The server is returned paused: it serves from Resume (after the handover commits), so a
  // successor that fails before then has answered nothing.
  static absl::StatusOr<std::unique_ptr<SessionServer>> Adopt(
      const SessionServerOptions& options, sessions::SessionTable* sessions,
      const handover::SessionServerState& state, std::vector<UniqueFd>* fds);
  // Stops the poll thread and lets the admission workers finish the packets it had read (returns
  // once both are done): nothing more is accepted or read, packets wait in the sockets, and every
  // SUBMIT read before has been answered. Answers to waits registered earlier are still sent (by
  // the threads that end the transfers). Pause, Resume and ExportState are called from one
  // thread.
  virtual void Pause() = 0;
  // Starts the poll thread again (a server that Start returned runs already).
  virtual void Resume() = 0;
  // While paused: duplicates of the listener, of every connection and of their completion
  // queues' descriptors, appended to `fds` and named by index.
  virtual absl::Status ExportState(handover::SessionServerState* out,
                                   std::vector<UniqueFd>* fds) const = 0;
};

}  // namespace kvrail::session
