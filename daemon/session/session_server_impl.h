// SessionServerImpl, the server behind session_server.h, shared by its parts (internal to
// //daemon/session:session: users include session_server.h only):
//   session_server.cc   set-up (Start, Adopt), teardown, pause / resume, the handover export
//   session_poll.cc     the poll loop, accepting connections (caps, descriptors), dropping them
//   session_packets.cc  one packet of a session: FD, WAIT, CQ, SUBMIT, POST
//   session_queues.cc   the sessions' submission queues: mapped, watched, entries admitted
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/spin_budget.h"
#include "base/unique_fd.h"
#include "daemon/handover/state.pb.h"
#include "daemon/session/admission.h"
#include "daemon/session/session_server.h"
#include "daemon/session/session_sinks.h"
#include "daemon/session/submission_intake.h"
#include "daemon/sessions/sessions.h"
#include "proto/kvrail/v1/transfer.pb.h"
#include "wire/session_wire.h"

namespace kvrail::session {

void SendPacket(int fd, const std::string& text);

// Whether descriptor number `fd` lies within `headroom` of the soft RLIMIT_NOFILE: descriptors
// are numbered lowest-free first, so at least `fd` others are open.
bool ShortOfFds(int fd, size_t headroom);

absl::Status ShortOfFdsError();

// A SUBMIT packet longer than this is never parsed on the poll thread (it goes to a worker): a
// body within SessionServerOptions::max_inline_submit_ids ids is far shorter.
inline constexpr size_t kMaxInlineSubmitBytes = 16 << 10;

// epoll user data for the two fds that are not sessions (sessions carry their fd number).
inline constexpr uint64_t kWakeTag = ~uint64_t{0};
inline constexpr uint64_t kListenerTag = ~uint64_t{0} - 1;
// A session's submission queue eventfd: this bit and the session's fd number.
inline constexpr uint64_t kSubmissionTag = uint64_t{1} << 62;
// Entries taken from one submission queue per look (the rest at the next: sessions take turns).
inline constexpr size_t kMaxEntriesPerLook = 256;
// A batch of at most this many small entries is admitted on the poll thread (as a small SUBMIT
// is) when its session has nothing queued.
inline constexpr size_t kMaxInlineEntries = 8;
// The spin budget's window (SessionServerOptions::spin_budget): the most unused budget banked.
inline constexpr absl::Duration kSpinBudgetWindow = absl::Milliseconds(100);

// Thread contract: the poll thread (Loop) owns the listener, epoll and the session map and reads
// every packet; admission workers serve the packets it posts to AdmissionPool (SUBMITs, and what
// a session sent behind one), one at a time per session; the threads that end transfers answer
// WAITs and post completions. What they share is a Connection (its own lock), PendingWaits and
// the region table (thread-safe). The public methods are thread-safe.
class SessionServerImpl final : public SessionServer {
 public:
  SessionServerImpl(UniqueFd listener, UniqueFd wake_read, UniqueFd wake_write, UniqueFd epoll,
                    sessions::SessionTable* sessions, SessionServerOptions options);
  ~SessionServerImpl() override;

  size_t active_sessions() const override;
  size_t admissions_queued() const override;
  AdmissionDepth admission_depth() const override;

  void Pause() override;
  void Resume() override;
  absl::Status ExportState(handover::SessionServerState* out,
                           std::vector<UniqueFd>* fds) const override;

  // Takes a predecessor's connections (their sessions are already in the region table). Before
  // Resume: the poll thread does not run yet.
  absl::Status AdoptConnections(const handover::SessionServerState& state,
                                std::vector<UniqueFd>* fds);

  static absl::StatusOr<UniqueFd> TakeHanded(std::vector<UniqueFd>* fds, int32_t index,
                                             absl::string_view field);

 private:
  // One client connection. Answers to WAIT are sent from whichever thread ends the transfer, and
  // answers to SUBMIT from an admission worker, so sends and the close are serialized here; after
  // the close nothing is sent (the fd number may already belong to another connection).
  struct Connection {
    Connection(uint64_t session_id, uint32_t peer_uid, UniqueFd socket)
        : id(session_id), uid(peer_uid), fd(std::move(socket)) {}
    void Send(const std::string& text) {
      absl::MutexLock lock(&mu);
      if (fd.valid()) SendPacket(fd.get(), text);
    }
    void Close() {
      absl::MutexLock lock(&mu);
      fd = UniqueFd();
    }
    const uint64_t id;
    const uint32_t uid;
    absl::Mutex mu;
    UniqueFd fd ABSL_GUARDED_BY(mu);
    // WAITs of this connection not answered yet (SessionServerOptions::max_waits_per_connection);
    // taken on the poll thread, given back by whichever thread ends the transfer.
    std::atomic<size_t> pending_waits{0};
    // Set once by "CQ"; read by its SUBMITs (on the poll thread or an admission worker).
    std::shared_ptr<CompletionSink> Completions() {
      absl::MutexLock lock(&mu);
      return completions;
    }
    std::shared_ptr<CompletionSink> completions ABSL_GUARDED_BY(mu);
    // Set once by "SQ"; the poll thread's (ExportState reads it while the thread is stopped).
    // Admission tasks hold their own reference.
    std::shared_ptr<SubmissionIntake> intake;
  };

  // One packet as read by the poll thread, to be served on it or by an admission worker.
  struct Packet {
    wire::RequestKind kind = wire::RequestKind::kOther;
    std::string body;  // what follows "SUBMIT " / "WAIT " (a copy: the receive buffer is reused)
    std::vector<UniqueFd> fds;
    bool truncated = false;
  };

  // An entry's request: a submit, or the post of a prepared transfer (a kPostKind entry), or
  // its refusal naming the field.
  struct ParsedEntry {
    absl::StatusOr<v1::SubmitTransferRequest> request =
        absl::Status(absl::StatusCode::kUnknown, "");
    std::optional<v1::PostTransferRequest> post;  // a kPostKind entry (request unused)
  };

  // --- Set-up and teardown (session_server.cc) ---

  static UniqueFd OpenReserve();

  // Stops the poll thread (if it runs) and returns once it has stopped.
  void StopPolling();

  // --- The poll loop and the connections (session_poll.cc) ---

  bool Watch(int fd, uint64_t tag);

  void Loop();

  // The thread goes to sleep: the spin it held against the budget found nothing and is drawn
  // (counted in options_.spin_spent_ns).
  void SettleSpin(SpinBudget& budget);

  // epoll_pwait2 until `until` (to the microsecond, unlike epoll_wait's milliseconds).
  int EpollUntil(std::vector<epoll_event>& events, absl::Time until);
  // Predictive wake: a spin from `now` to `until` over the sockets (*predicted_until) and every
  // submission queue (SpinUntil); *predicted is set (a predicted spin is under way) and the spin
  // counted in `counts`.
  void StartPredictedSpin(absl::Time now, absl::Time until, absl::Time* predicted_until,
                          bool* predicted, SessionServerOptions::WakeCounts& counts);

  void PauseListener();
  void ResumeListener();

  // Accepts what is pending (the listener is non-blocking), a bounded number per wake-up.
  void AcceptAll();

  // accept failed for want of descriptors: the reserve descriptor is given up to take the
  // connection and refuse it (so it does not stay pending and keep the listener readable), then
  // taken again. Without a reserve the listener pauses.
  void RefuseWithReserve();

  // RESOURCE_EXHAUSTED naming the cap a new connection of `uid` would pass; OK otherwise.
  absl::Status CheckCaps(int fd, uint32_t uid) const;

  void Admit(UniqueFd fd);

  void Drop(absl::flat_hash_map<int, std::shared_ptr<Connection>>::iterator it);

  // --- Packets (session_packets.cc) ---

  // Reads one packet from a session; a closed or broken connection ends the session, a packet
  // that could not be read whole (too many descriptors) is answered with ERROR.
  void Serve(int fd);

  // Serves one packet of `conn` (`body`: the packet's, unless given). Thread-safe; one at a time
  // per session (the poll thread while the session's admission queue is idle, else its worker).
  void Handle(const std::shared_ptr<Connection>& conn, Packet& packet,
              std::optional<absl::string_view> given_body = std::nullopt);

  // WAIT <id>: answered with DONE when the transfer ends, from the thread that ends it (at once
  // when it has ended), or REJECTED at once. The poll thread never waits.
  void Wait(const std::shared_ptr<Connection>& conn, bool plain, absl::string_view body);
  // A CANCEL's answer, as the connection's session.
  std::string Cancel(const Connection& conn, bool plain, absl::string_view body);

  // "CQ" with a completion queue's memfd and eventfd: mapped (and sealed) here, checked, and
  // used for every transfer this connection submits from now on. Answers "CQ OK" or REJECTED.
  std::string MapCompletionQueue(Connection* conn, std::vector<UniqueFd> fds, bool truncated);

  // Posts transfer `id`'s final state into the connection's completion queue when it ends.
  void PostWhenDone(const Connection& conn, const std::shared_ptr<CompletionSink>& sink,
                    uint64_t id, uint64_t tag);

  // The answer to one SUBMIT packet (`request`: the serialized SubmitTransferRequest).
  std::string Submit(absl::string_view body, const std::shared_ptr<Connection>& conn);

  // The answer to a parsed SUBMIT (options_.submit is set).
  std::string SubmitParsed(v1::SubmitTransferRequest request,
                           const std::shared_ptr<Connection>& conn);

  // The answer to one POST packet: a prepared transfer of the connection's session posted
  // (options_.post), answered as a SUBMIT; its end goes to the session's completion queue.
  std::string Post(absl::string_view body, const std::shared_ptr<Connection>& conn);

  // Posts a prepared transfer of `conn`'s session (a POST packet's or a kPostKind entry's, `tag`
  // its tag); its end goes to the session's completion queue when it has one.
  absl::StatusOr<v1::SubmitTransferResponse> AdmitPost(const v1::PostTransferRequest& post,
                                                       const std::shared_ptr<Connection>& conn,
                                                       uint64_t tag);

  // Admits a parsed request of `conn`'s session (a SUBMIT packet's or a submission queue
  // entry's, `tag` its tag): the connection's session is the submitter, whatever the spec
  // claims, and the transfer's end goes to the session's completion queue when it has one.
  // `request` stays the caller's: a submission queue's entry frees it after posting the
  // acknowledgement (freeing a spec of many ids is no part of the client's wait).
  absl::StatusOr<v1::SubmitTransferResponse> Admit(v1::SubmitTransferRequest& request,
                                                   const std::shared_ptr<Connection>& conn,
                                                   uint64_t tag);

  // --- Submission queues (session_queues.cc) ---

  // "SQ" with a submission queue's four descriptors: mapped, checked, and watched by the poll
  // thread from now on. Answers "SQ OK" or REJECTED.
  std::string MapSubmissionQueue(int fd, Connection* conn, std::vector<UniqueFd> fds,
                                 bool truncated);

  // Watches the queue's eventfd (tagged with the connection's fd number). Its need_wake rests
  // set: the client rings the eventfd unless the poll thread is looking at the queue.
  absl::Status WatchSubmissions(int fd, Connection* conn, std::unique_ptr<SubmissionIntake> intake);

  // One round of the submission queues (SubmissionQueues::Look); whether entries came.
  bool LookAtQueues(bool may_spin);

  // Admits the entries of one look, in order, and acknowledges each: on the poll thread when
  // they are few and small and the session has nothing queued (as a small SUBMIT: parsed here
  // only then, never more than kMaxInlineSubmitBytes), else as one task of the session's
  // admission queue (after its earlier packets), which parses them.
  void AdmitEntries(const std::shared_ptr<Connection>& conn,
                    std::vector<SubmissionIntake::Entry> entries);

  static ParsedEntry ParseEntry(const SubmissionIntake::Entry& entry);

  // Whether a parsed entry is small enough to admit on the poll thread (a refusal is).
  bool AdmitsInlineEntry(const ParsedEntry& p) const;

  // Admits one entry's request and posts its acknowledgement.
  void AdmitEntry(uint64_t tag, ParsedEntry p, const std::shared_ptr<Connection>& conn,
                  SubmissionIntake& intake);

  UniqueFd listener_;
  UniqueFd wake_read_;
  UniqueFd wake_write_;
  UniqueFd epoll_;
  sessions::SessionTable* const table_;  // the sessions this server begins and ends
  const SessionServerOptions options_;
  const std::shared_ptr<PendingWaits> pending_waits_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> count_{0};
  // Owned by the poll thread only.
  absl::flat_hash_map<int, std::shared_ptr<Connection>> sessions_;
  absl::flat_hash_map<uint32_t, size_t> per_uid_;  // open sessions per uid
  UniqueFd reserve_;  // a spare descriptor, given up to refuse a connection when out of them
  bool listener_paused_ = false;
  absl::Time resume_at_;
  uint64_t refused_for_fds_ = 0;
  wire::ReceiveBuffer packet_;  // the poll thread's receive buffer
  // The sessions' submission queues, by connection fd.
  SubmissionQueues queues_;
  // Admits SUBMITs off the poll thread (none with admission_workers 0). Its tasks use the
  // fields above; it is destroyed first (explicitly, in the destructor).
  std::unique_ptr<AdmissionPool> admission_;
  std::thread thread_;
};

}  // namespace kvrail::session
