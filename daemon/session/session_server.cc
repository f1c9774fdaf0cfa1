#include "daemon/session/session_server.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "daemon/server/private_bind.h"
#include "daemon/session/admission.h"
#include "daemon/session/session_sinks.h"
#include "daemon/session/spin_budget.h"
#include "daemon/session/submission_intake.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"
#include "wire/shm_ring.h"
#include "wire/submission_queue.h"

namespace kvrail::session {
namespace {

void SendPacket(int fd, const std::string& text) {
  // A client that stopped reading only loses its own answer.
  (void)wire::SendPacket(fd, text, -1, MSG_DONTWAIT);
}

// Whether descriptor number `fd` lies within `headroom` of the soft RLIMIT_NOFILE: descriptors
// are numbered lowest-free first, so at least `fd` others are open.
bool ShortOfFds(int fd, size_t headroom) {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return false;
  return static_cast<rlim_t>(fd) + headroom >= limit.rlim_cur;
}

absl::Status ShortOfFdsError() {
  return absl::ResourceExhaustedError(
      "the daemon is short of file descriptors (RLIMIT_NOFILE); try again later");
}

// A SUBMIT packet longer than this is never parsed on the poll thread (it goes to a worker): a
// body within SessionServerOptions::max_inline_submit_ids ids is far shorter.
constexpr size_t kMaxInlineSubmitBytes = 16 << 10;

// epoll user data for the two fds that are not sessions (sessions carry their fd number).
constexpr uint64_t kWakeTag = ~uint64_t{0};
constexpr uint64_t kListenerTag = ~uint64_t{0} - 1;
// A session's submission queue eventfd: this bit and the session's fd number.
constexpr uint64_t kSubmissionTag = uint64_t{1} << 62;
// Entries taken from one submission queue per look (the rest at the next: sessions take turns).
constexpr size_t kMaxEntriesPerLook = 256;
// A batch of at most this many small entries is admitted on the poll thread (as a small SUBMIT
// is) when its session has nothing queued.
constexpr size_t kMaxInlineEntries = 8;
// The spin budget's window (SessionServerOptions::spin_budget): the most unused budget banked.
constexpr absl::Duration kSpinBudgetWindow = absl::Milliseconds(100);

// Thread contract: the poll thread (Loop) owns the listener, epoll and the session map and reads
// every packet; admission workers serve the packets it posts to AdmissionPool (SUBMITs, and what
// a session sent behind one), one at a time per session; the threads that end transfers answer
// WAITs and post completions. What they share is a Connection (its own lock), PendingWaits and
// the region table (thread-safe). The public methods are thread-safe.
class SessionServerImpl final : public SessionServer {
 public:
  SessionServerImpl(UniqueFd listener, UniqueFd wake_read, UniqueFd wake_write, UniqueFd epoll,
                    sessions::SessionTable* sessions, SessionServerOptions options)
      : listener_(std::move(listener)),
        wake_read_(std::move(wake_read)),
        wake_write_(std::move(wake_write)),
        epoll_(std::move(epoll)),
        table_(sessions),
        options_(std::move(options)),
        pending_waits_(std::make_shared<PendingWaits>(options_.max_waits_per_uid)),
        packet_(wire::kMaxRequestBytes),
        queues_(options_.submission_spin) {
    if (options_.admission_workers > 0) {
      admission_ = std::make_unique<AdmissionPool>(options_.admission_workers,
                                                   options_.max_queued_per_session);
    }
    reserve_ = OpenReserve();
    if (!Watch(wake_read_.get(), kWakeTag) || !Watch(listener_.get(), kListenerTag)) {
      spdlog::error("session socket: epoll_ctl failed: {}", std::strerror(errno));
    }
  }

  ~SessionServerImpl() override {
    StopPolling();
    // Admissions running finish (their answers go out), queued ones are dropped unrun, and the
    // sessions closed while one of theirs ran are ended, before the open ones are below.
    admission_.reset();
    for (auto& [fd, session] : sessions_) {
      session->Close();
      table_->EndSession(session->id);
    }
  }

  size_t active_sessions() const override { return count_.load(); }
  size_t admissions_queued() const override {
    return admission_ != nullptr ? admission_->queued() : 0;
  }
  AdmissionDepth admission_depth() const override {
    AdmissionDepth depth;
    if (admission_ != nullptr) {
      depth.queued = admission_->queued();
      depth.running = admission_->running();
      depth.deepest = admission_->deepest();
    }
    return depth;
  }

  void Pause() override {
    StopPolling();
    // Nothing is posted any more: the packets already read are served (SUBMITs admitted and
    // answered), so a handover leaves none of them behind.
    if (admission_ != nullptr) admission_->AwaitIdle();
  }

  void Resume() override {
    if (thread_.joinable()) return;
    stop_.store(false);
    thread_ = std::thread([this] { Loop(); });
  }

  absl::Status ExportState(handover::SessionServerState* out,
                           std::vector<UniqueFd>* fds) const override {
    if (thread_.joinable()) {
      return absl::FailedPreconditionError("handover: the session server is not paused");
    }
    auto dup = [fds](int fd) -> absl::StatusOr<int32_t> {
      UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
      if (!copy.valid()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "handover: cannot duplicate a session socket descriptor: ", std::strerror(errno)));
      }
      fds->push_back(std::move(copy));
      return static_cast<int32_t>(fds->size() - 1);
    };
    KVRAIL_ASSIGN_OR_RETURN(const int32_t listener, dup(listener_.get()));
    out->set_listener_fd(listener);
    for (const auto& [raw, conn] : sessions_) {
      handover::ConnectionRecord* record = out->add_connections();
      record->set_session_id(conn->id);
      record->set_uid(conn->uid);
      KVRAIL_ASSIGN_OR_RETURN(const int32_t index, dup(raw));
      record->set_fd(index);
      record->set_completion_memfd(-1);
      record->set_completion_eventfd(-1);
      if (const std::shared_ptr<CompletionSink> sink = conn->Completions(); sink != nullptr) {
        KVRAIL_ASSIGN_OR_RETURN(const int32_t memfd, dup(sink->memfd()));
        KVRAIL_ASSIGN_OR_RETURN(const int32_t eventfd, dup(sink->eventfd()));
        record->set_completion_memfd(memfd);
        record->set_completion_eventfd(eventfd);
      }
      if (const std::shared_ptr<SubmissionIntake>& sq = conn->intake; sq != nullptr) {
        handover::SubmissionQueueFds* q = record->mutable_submission_queue();
        KVRAIL_ASSIGN_OR_RETURN(const int32_t sq_memfd, dup(sq->sq_memfd()));
        KVRAIL_ASSIGN_OR_RETURN(const int32_t sq_eventfd, dup(sq->sq_eventfd()));
        KVRAIL_ASSIGN_OR_RETURN(const int32_t ack_memfd, dup(sq->ack_memfd()));
        KVRAIL_ASSIGN_OR_RETURN(const int32_t ack_eventfd, dup(sq->ack_eventfd()));
        q->set_sq_memfd(sq_memfd);
        q->set_sq_eventfd(sq_eventfd);
        q->set_ack_memfd(ack_memfd);
        q->set_ack_eventfd(ack_eventfd);
      }
    }
    return absl::OkStatus();
  }

  // Takes a predecessor's connections (their sessions are already in the region table). Before
  // Resume: the poll thread does not run yet.
  absl::Status AdoptConnections(const handover::SessionServerState& state,
                                std::vector<UniqueFd>* fds) {
    for (const handover::ConnectionRecord& record : state.connections()) {
      KVRAIL_ASSIGN_OR_RETURN(UniqueFd fd, TakeHanded(fds, record.fd(), "connections.fd"));
      if (!table_->SessionOpen(record.session_id())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "handover: connections: session ", record.session_id(), " is not in the region table"));
      }
      const int raw = fd.get();
      epoll_event event{};
      event.events = EPOLLIN | EPOLLRDHUP;
      event.data.u64 = static_cast<uint64_t>(raw);
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw, &event) != 0) {
        return absl::InternalError(absl::StrCat("handover: epoll_ctl: ", std::strerror(errno)));
      }
      auto conn = std::make_shared<Connection>(record.session_id(), record.uid(), std::move(fd));
      if (record.completion_memfd() >= 0) {
        KVRAIL_ASSIGN_OR_RETURN(UniqueFd memfd,
                                TakeHanded(fds, record.completion_memfd(), "completion_memfd"));
        KVRAIL_ASSIGN_OR_RETURN(UniqueFd eventfd,
                                TakeHanded(fds, record.completion_eventfd(), "completion_eventfd"));
        // The ring's head and tail are in the shared memory: posting goes on where it stopped.
        absl::StatusOr<std::unique_ptr<wire::SharedRing>> ring = wire::SharedRing::Attach(
            std::move(memfd), std::move(eventfd), wire::kCompletionEntryBytes);
        if (!ring.ok()) {
          return absl::Status(ring.status().code(),
                              absl::StrCat("handover: session ", record.session_id(),
                                           ": completion queue: ", ring.status().message()));
        }
        absl::MutexLock lock(&conn->mu);
        conn->completions = std::make_shared<CompletionSink>(std::move(*ring));
      }
      if (record.has_submission_queue()) {
        const handover::SubmissionQueueFds& q = record.submission_queue();
        std::vector<UniqueFd> queue_fds;
        for (const auto& [index, field] :
             {std::pair<int32_t, const char*>{q.sq_memfd(), "submission_queue.sq_memfd"},
              {q.sq_eventfd(), "submission_queue.sq_eventfd"},
              {q.ack_memfd(), "submission_queue.ack_memfd"},
              {q.ack_eventfd(), "submission_queue.ack_eventfd"}}) {
          KVRAIL_ASSIGN_OR_RETURN(UniqueFd fd, TakeHanded(fds, index, field));
          queue_fds.push_back(std::move(fd));
        }
        absl::StatusOr<std::unique_ptr<SubmissionIntake>> intake =
            SubmissionIntake::Attach(std::move(queue_fds));
        if (!intake.ok()) {
          return absl::Status(intake.status().code(),
                              absl::StrCat("handover: session ", record.session_id(), ": ",
                                           intake.status().message()));
        }
        KVRAIL_RETURN_IF_ERROR(WatchSubmissions(raw, conn.get(), *std::move(intake)));
      }
      if (admission_ != nullptr) admission_->Open(record.session_id());
      sessions_.emplace(raw, std::move(conn));
      ++per_uid_[record.uid()];
    }
    count_.store(sessions_.size());
    return absl::OkStatus();
  }

  static absl::StatusOr<UniqueFd> TakeHanded(std::vector<UniqueFd>* fds, int32_t index,
                                             absl::string_view field) {
    if (index < 0 || static_cast<size_t>(index) >= fds->size() || !(*fds)[index].valid()) {
      return absl::InvalidArgumentError(absl::StrCat("handover: ", field, ": descriptor ", index,
                                                     " is not in the bundle (or used twice)"));
    }
    return std::move((*fds)[index]);
  }

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

  static UniqueFd OpenReserve() { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

  // Stops the poll thread (if it runs) and returns once it has stopped.
  void StopPolling() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    const char b = 1;
    (void)::write(wake_write_.get(), &b, 1);
    thread_.join();
    // The wake-up bytes are spent: a resumed loop must not spin on them.
    char drain[64];
    while (::read(wake_read_.get(), drain, sizeof(drain)) > 0) {
    }
  }

  bool Watch(int fd, uint64_t tag) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tag;
    return ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) == 0;
  }

  void Loop() {
    std::vector<epoll_event> events(256);
    // After serving a packet the thread polls without sleeping for options_.spin (the next
    // packet of a critical transfer, e.g. its WAIT, then costs no wake-up), and it polls the
    // submission queues that spin (SubmissionQueues). Both draw on one budget: a round that
    // spun and found nothing is charged to it, and once it is spent every spin ends.
    absl::Time spin_until = absl::InfinitePast();
    SpinBudget budget(options_.spin_budget, kSpinBudgetWindow, absl::Now());
    while (!stop_.load()) {
      const absl::Time round = absl::Now();
      const bool may_spin = budget.Allows(round);
      if (!may_spin) spin_until = absl::InfinitePast();
      // While the listener is paused (out of descriptors with no reserve left) it is retried
      // every 100 ms instead of being polled in a spin.
      const bool spinning = options_.spin > absl::ZeroDuration() && round < spin_until;
      if (spinning && options_.spin_polls != nullptr) {
        options_.spin_polls->fetch_add(1, std::memory_order_relaxed);
      }
      // A round of polling only: nothing due, a spin is what keeps the thread awake.
      const bool spin_round = (spinning || queues_.Spinning()) && !queues_.Due();
      const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                                 spinning || queues_.Busy() ? 0
                                 : listener_paused_         ? 100
                                                            : -1);
      // Before the events: an eventfd that rang is looked at in this round, below.
      for (int i = 0; i < n; ++i) {
        const uint64_t tag = events[i].data.u64;
        if (tag != kWakeTag && tag != kListenerTag && (tag & kSubmissionTag) != 0) {
          queues_.Woken(static_cast<int>(tag & ~kSubmissionTag));
        }
      }
      if (n == 0 && spinning && !queues_.Busy()) {
        ChargeSpin(budget, round);
        continue;
      }
      if (n > 0 && options_.spin > absl::ZeroDuration()) spin_until = absl::Now() + options_.spin;
      if (n < 0) {
        if (errno == EINTR) continue;
        spdlog::error("session socket: epoll_wait failed: {}", std::strerror(errno));
        return;
      }
      if (listener_paused_ && absl::Now() >= resume_at_) ResumeListener();
      for (int i = 0; i < n; ++i) {
        const uint64_t tag = events[i].data.u64;
        if (tag == kWakeTag) continue;
        if (tag == kListenerTag) {
          AcceptAll();
        } else if ((tag & kSubmissionTag) != 0) {
          continue;  // taken in LookAtQueues
        } else {
          Serve(static_cast<int>(tag));
        }
      }
      const bool took = queues_.Busy() && LookAtQueues(may_spin);
      if (spin_round && n == 0 && !took) ChargeSpin(budget, round);
    }
  }

  // A round that began at `round` polled and found nothing: charged to the spin budget.
  void ChargeSpin(SpinBudget& budget, absl::Time round) {
    const absl::Time now = absl::Now();
    budget.Spent(round, now);
    if (options_.spin_spent_ns != nullptr) {
      options_.spin_spent_ns->fetch_add(absl::ToInt64Nanoseconds(now - round),
                                        std::memory_order_relaxed);
    }
  }

  void PauseListener() {
    if (listener_paused_) return;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
    listener_paused_ = true;
    resume_at_ = absl::Now() + absl::Milliseconds(100);
  }

  void ResumeListener() {
    listener_paused_ = false;
    if (!reserve_.valid()) reserve_ = OpenReserve();
    if (!Watch(listener_.get(), kListenerTag)) PauseListener();
  }

  // Accepts what is pending (the listener is non-blocking), a bounded number per wake-up.
  void AcceptAll() {
    for (int i = 0; i < 64 && !listener_paused_; ++i) {
      UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (fd.valid()) {
        Admit(std::move(fd));
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        RefuseWithReserve();
        continue;
      }
      return;  // EAGAIN: nothing more pending
    }
  }

  // accept failed for want of descriptors: the reserve descriptor is given up to take the
  // connection and refuse it (so it does not stay pending and keep the listener readable), then
  // taken again. Without a reserve the listener pauses.
  void RefuseWithReserve() {
    if (!reserve_.valid()) {
      spdlog::warn("session socket: out of file descriptors; refusing connections for 100 ms");
      PauseListener();
      return;
    }
    reserve_ = UniqueFd();
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.valid()) SendPacket(fd.get(), wire::EncodeRejected(ShortOfFdsError()));
    fd = UniqueFd();
    reserve_ = OpenReserve();
    if (++refused_for_fds_ % 1000 == 1) {
      spdlog::warn("session socket: out of file descriptors; connections refused ({} so far)",
                   refused_for_fds_);
    }
    if (!reserve_.valid()) PauseListener();
  }

  // RESOURCE_EXHAUSTED naming the cap a new connection of `uid` would pass; OK otherwise.
  absl::Status CheckCaps(int fd, uint32_t uid) const {
    if (ShortOfFds(fd, options_.fd_headroom)) return ShortOfFdsError();
    if (sessions_.size() >= options_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("max_sessions: ", sessions_.size(),
                       " sessions are open, the most this daemon serves "
                       "(DaemonConfig.max_sessions)"));
    }
    auto it = per_uid_.find(uid);
    if (it != per_uid_.end() && it->second >= options_.max_sessions_per_uid) {
      return absl::ResourceExhaustedError(
          absl::StrCat("max_sessions_per_uid: uid ", uid, " has ", it->second,
                       " sessions open, the most allowed (DaemonConfig.max_sessions_per_uid)"));
    }
    return absl::OkStatus();
  }

  void Admit(UniqueFd fd) {
    // The connection's process (SO_PEERCRED) decides whether the session is the operator's.
    struct ucred cred {};
    socklen_t len = sizeof(cred);
    const bool known = ::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    const uint32_t uid = known ? cred.uid : ~uint32_t{0};
    if (absl::Status capped = CheckCaps(fd.get(), uid); !capped.ok()) {
      spdlog::debug("session refused: {}", capped.ToString());
      SendPacket(fd.get(), wire::EncodeRejected(capped));
      return;
    }
    const int raw = fd.get();
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.u64 = static_cast<uint64_t>(raw);
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw, &event) != 0) {
      SendPacket(raw, wire::EncodeRejected(absl::ResourceExhaustedError(absl::StrCat(
                          "the daemon cannot watch another connection: ", std::strerror(errno)))));
      return;
    }
    const uint64_t id = table_->BeginSession();
    if (known) table_->SetSessionPeer(id, cred.uid);
    if (admission_ != nullptr) admission_->Open(id);
    // The secret goes to this connection only: it binds the client's gRPC calls to the session.
    SendPacket(raw, wire::EncodeGreeting(id, options_.instance_id, table_->SessionSecret(id)));
    spdlog::debug("session {} opened (uid {})", id, uid);
    sessions_.emplace(raw, std::make_shared<Connection>(id, uid, std::move(fd)));
    ++per_uid_[uid];
    count_.store(sessions_.size());
  }

  void Drop(absl::flat_hash_map<int, std::shared_ptr<Connection>>::iterator it) {
    const std::shared_ptr<Connection> conn = it->second;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->first, nullptr);
    if (conn->intake != nullptr) {
      // The client still holds the eventfd: unwatched here, or it would stay in the epoll set.
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, conn->intake->sq_eventfd(), nullptr);
      queues_.Remove(it->first);
    }
    conn->Close();
    if (admission_ != nullptr) {
      // Its queued packets are dropped unrun (nothing of them reaches its memory or its socket);
      // a SUBMIT being admitted finishes first, and the session ends after it, so that transfer
      // is ended with the session's others.
      const size_t dropped =
          admission_->Close(conn->id, [table = table_, id = conn->id] { table->EndSession(id); });
      if (dropped > 0) {
        spdlog::info("session {} closed with {} packets queued for admission: not served", conn->id,
                     dropped);
      }
    } else {
      table_->EndSession(conn->id);
    }
    auto uid = per_uid_.find(conn->uid);
    if (uid != per_uid_.end() && --uid->second == 0) per_uid_.erase(uid);
    sessions_.erase(it);
    count_.store(sessions_.size());
  }

  // Reads one packet from a session; a closed or broken connection ends the session, a packet
  // that could not be read whole (too many descriptors) is answered with ERROR.
  void Serve(int fd) {
    auto it = sessions_.find(fd);
    if (it == sessions_.end()) return;  // dropped earlier in this round
    const std::shared_ptr<Connection> conn = it->second;
    absl::StatusOr<wire::Received> received = wire::ReceiveMessage(fd, &packet_, MSG_DONTWAIT);
    if (!received.ok()) {
      switch (received.status().code()) {
        case absl::StatusCode::kDeadlineExceeded:  // nothing to read after all
          return;
        case absl::StatusCode::kUnavailable:  // closed, reset or broken
          spdlog::debug("session {} closed: {}", conn->id,
                        std::string(received.status().message()));
          Drop(it);
          return;
        default:
          conn->Send(wire::EncodeError(received.status().message()));
          return;
      }
    }
    // Every descriptor received is owned by `received` and closed unless handed on below.
    const wire::Request request = wire::ParseRequest(received->payload);
    if (request.kind == wire::RequestKind::kSubmissionQueue) {
      // Served here (it changes the epoll set, the poll thread's), after the answers queued
      // before it: a session with packets still queued is asked to send it again later.
      conn->Send(
          admission_ != nullptr && !admission_->Idle(conn->id)
              ? wire::EncodeRejected(absl::UnavailableError(
                    "SQ: the session has packets queued for admission; send SQ again"))
              : MapSubmissionQueue(fd, conn.get(), std::move(received->fds), received->truncated));
      return;
    }
    // A small SUBMIT (AdmitsInline) of a session with nothing queued is admitted here: the
    // hand-off to a worker would cost it as much as its admission. So is a small POST (its ids
    // in the packet; nothing but they are checked).
    if (admission_ != nullptr && request.kind == wire::RequestKind::kPost && options_.post &&
        received->fds.empty() && !received->truncated &&
        request.body.size() <= kMaxInlineSubmitBytes && admission_->Idle(conn->id)) {
      conn->Send(Post(request.body, conn));
      return;
    }
    if (admission_ != nullptr && request.kind == wire::RequestKind::kSubmit && options_.submit &&
        received->fds.empty() && !received->truncated &&
        request.body.size() <= kMaxInlineSubmitBytes && admission_->Idle(conn->id)) {
      absl::StatusOr<v1::SubmitTransferRequest> parsed = wire::ParseSubmitBody(request.body);
      if (parsed.ok() && AdmitsInline(parsed->spec(), options_.max_inline_submit_ids)) {
        conn->Send(SubmitParsed(*std::move(parsed), conn));
        return;
      }
    }
    // A SUBMIT is admitted by a worker; a packet behind one still queued or running follows it
    // there, so the session's answers keep the order of its packets. Other packets are served
    // here (FD, WAIT and CQ cost no more than a lookup).
    if (admission_ != nullptr &&
        (request.kind == wire::RequestKind::kSubmit || request.kind == wire::RequestKind::kPost ||
         !admission_->Idle(conn->id))) {
      auto packet = std::make_unique<Packet>();
      packet->kind = request.kind;
      packet->body = std::string(request.body);
      packet->fds = std::move(received->fds);
      packet->truncated = received->truncated;
      absl::Status queued = admission_->Post(
          conn->id, [this, conn, packet = std::move(packet)]() mutable { Handle(conn, *packet); });
      // Refused at once (ahead of the answers still queued): the client library sends one
      // packet at a time per connection, so only a client that pipelines meets the cap.
      if (!queued.ok()) conn->Send(wire::EncodeRejected(queued));
      return;
    }
    Packet packet;
    packet.kind = request.kind;
    packet.fds = std::move(received->fds);
    packet.truncated = received->truncated;
    Handle(conn, packet, request.body);
  }

  // Serves one packet of `conn` (`body`: the packet's, unless given). Thread-safe; one at a time
  // per session (the poll thread while the session's admission queue is idle, else its worker).
  void Handle(const std::shared_ptr<Connection>& conn, Packet& packet,
              std::optional<absl::string_view> given_body = std::nullopt) {
    const absl::string_view body = given_body.has_value() ? *given_body : packet.body;
    const bool plain = packet.fds.empty() && !packet.truncated;
    switch (packet.kind) {
      case wire::RequestKind::kCompletionQueue:
        conn->Send(MapCompletionQueue(conn.get(), std::move(packet.fds), packet.truncated));
        return;
      case wire::RequestKind::kSubmissionQueue:  // served by the poll thread (Serve)
        return;
      case wire::RequestKind::kSubmit:
        conn->Send(plain ? Submit(body, conn)
                         : wire::EncodeRejected(absl::InvalidArgumentError(absl::StrCat(
                               "SUBMIT: the packet is larger than ", wire::kMaxRequestBytes,
                               " bytes or carries descriptors; use SubmitTransfer"))));
        return;
      case wire::RequestKind::kPost:
        conn->Send(plain ? Post(body, conn)
                         : wire::EncodeRejected(absl::InvalidArgumentError(absl::StrCat(
                               "POST: the packet is larger than ", wire::kMaxRequestBytes,
                               " bytes or carries descriptors; use PostTransfer"))));
        return;
      case wire::RequestKind::kWait:
        Wait(conn, plain, body);
        return;
      case wire::RequestKind::kFd:
        if (packet.fds.size() == 1) break;
        [[fallthrough]];
      case wire::RequestKind::kOther:
        conn->Send(wire::EncodeError("expected the packet \"FD\" carrying exactly one descriptor"));
        return;
    }
    if (ShortOfFds(packet.fds[0].get(), options_.fd_headroom)) {
      conn->Send(wire::EncodeError(ShortOfFdsError().message()));
      return;  // the descriptor is closed with `packet`
    }
    absl::StatusOr<std::string> token = table_->AddFd(conn->id, std::move(packet.fds[0]));
    conn->Send(token.ok() ? wire::EncodeToken(*token)
                          : wire::EncodeError(token.status().message()));
  }

  // WAIT <id>: answered with DONE when the transfer ends, from the thread that ends it (at once
  // when it has ended), or REJECTED at once. The poll thread never waits.
  void Wait(const std::shared_ptr<Connection>& conn, bool plain, absl::string_view body) {
    const absl::StatusOr<uint64_t> id = wire::ParseWaitBody(body, plain);
    if (!id.ok()) {
      conn->Send(wire::EncodeRejected(id.status()));
      return;
    }
    if (!options_.wait) {
      conn->Send(wire::EncodeRejected(
          absl::UnimplementedError("WAIT: this daemon answers waits over gRPC only")));
      return;
    }
    // The waiting session: the connection's, or the one the credential names (a client waits
    // on spare connections as its main session).
    absl::StatusOr<sessions::Caller> waiter =
        table_->Authenticate(conn->id, table_->SessionSecret(conn->id));
    if (body.find(' ') != absl::string_view::npos) {
      const auto credential = wire::ParseWaitCredential(body);
      waiter = credential.has_value()
                   ? table_->Authenticate(credential->first, credential->second)
                   : absl::StatusOr<sessions::Caller>(absl::UnauthenticatedError(
                         "WAIT: the credential is not \"<session id>.<secret>\""));
    }
    if (!waiter.ok()) {
      conn->Send(wire::EncodeRejected(waiter.status()));
      return;
    }
    // A client waits on one transfer per connection; each WAIT held costs memory until its
    // transfer ends, so they are capped per connection and per uid.
    if (conn->pending_waits.load() >= options_.max_waits_per_connection) {
      conn->Send(wire::EncodeRejected(absl::ResourceExhaustedError(absl::StrCat(
          "max_watchers_per_session: this connection has ", conn->pending_waits.load(),
          " WAITs pending, the most allowed (DaemonConfig.max_watchers_per_session); wait on "
          "one transfer per connection"))));
      return;
    }
    if (absl::Status placed = pending_waits_->Take(conn->uid); !placed.ok()) {
      conn->Send(wire::EncodeRejected(placed));
      return;
    }
    conn->pending_waits.fetch_add(1);
    std::weak_ptr<Connection> weak = conn;
    // Called at most once: when the transfer ends (at once when it has), or never when the
    // registration is refused.
    const absl::Status registered = options_.wait(
        *waiter, *id,
        [weak, uid = conn->uid, counts = pending_waits_](const v1::TransferStatus& status) {
          counts->Give(uid);
          if (auto c = weak.lock()) {
            c->pending_waits.fetch_sub(1);
            c->Send(wire::EncodeDone(status));
          }
        });
    if (!registered.ok()) {
      pending_waits_->Give(conn->uid);
      conn->pending_waits.fetch_sub(1);
      conn->Send(wire::EncodeRejected(registered));
    }
  }

  // "CQ" with a completion queue's memfd and eventfd: mapped (and sealed) here, checked, and
  // used for every transfer this connection submits from now on. Answers "CQ OK" or REJECTED.
  std::string MapCompletionQueue(Connection* conn, std::vector<UniqueFd> fds, bool truncated) {
    if (fds.size() != 2 || truncated) {
      return wire::EncodeRejected(absl::InvalidArgumentError(
          "CQ: expected the packet \"CQ\" carrying exactly two descriptors (memfd, eventfd)"));
    }
    if (conn->Completions() != nullptr) {
      return wire::EncodeRejected(
          absl::AlreadyExistsError("CQ: this session already has a completion queue"));
    }
    if (!options_.wait) {
      return wire::EncodeRejected(
          absl::UnimplementedError("CQ: this daemon answers waits over gRPC only"));
    }
    for (const UniqueFd& fd : fds) {
      if (ShortOfFds(fd.get(), options_.fd_headroom))
        return wire::EncodeRejected(ShortOfFdsError());
    }
    absl::StatusOr<std::unique_ptr<wire::SharedRing>> ring =
        wire::SharedRing::Attach(std::move(fds[0]), std::move(fds[1]), wire::kCompletionEntryBytes);
    if (!ring.ok()) {
      return wire::EncodeRejected(
          absl::InvalidArgumentError(absl::StrCat("CQ: ", ring.status().message())));
    }
    {
      absl::MutexLock lock(&conn->mu);
      conn->completions = std::make_shared<CompletionSink>(std::move(*ring));
    }
    spdlog::debug("session {}: completion queue mapped", conn->id);
    return wire::kCompletionQueueAccepted;
  }

  // Posts transfer `id`'s final state into the connection's completion queue when it ends.
  void PostWhenDone(const Connection& conn, const std::shared_ptr<CompletionSink>& sink,
                    uint64_t id, uint64_t tag) {
    absl::StatusOr<sessions::Caller> caller =
        table_->Authenticate(conn.id, table_->SessionSecret(conn.id));
    std::weak_ptr<CompletionSink> weak = sink;
    const auto& follow = options_.follow ? options_.follow : options_.wait;
    const absl::Status registered = caller.ok()
                                        ? follow(*caller, id,
                                                 [weak, tag](const v1::TransferStatus& status) {
                                                   if (auto sink = weak.lock())
                                                     sink->Post(status, tag);
                                                 })
                                        : caller.status();
    if (!registered.ok()) {
      spdlog::debug("session {}: transfer {} not followed by the completion queue: {}", conn.id, id,
                    registered.ToString());
      sink->Missed();
    }
  }

  // The answer to one SUBMIT packet (`request`: the serialized SubmitTransferRequest).
  std::string Submit(absl::string_view body, const std::shared_ptr<Connection>& conn) {
    if (!options_.submit) {
      return wire::EncodeRejected(
          absl::UnimplementedError("SUBMIT: this daemon takes transfers over gRPC only"));
    }
    absl::StatusOr<v1::SubmitTransferRequest> parsed = wire::ParseSubmitBody(body);
    if (!parsed.ok()) return wire::EncodeRejected(parsed.status());
    return SubmitParsed(*std::move(parsed), conn);
  }

  // The answer to a parsed SUBMIT (options_.submit is set).
  std::string SubmitParsed(v1::SubmitTransferRequest request,
                           const std::shared_ptr<Connection>& conn) {
    absl::StatusOr<v1::SubmitTransferResponse> accepted = Admit(std::move(request), conn, 0);
    return accepted.ok() ? wire::EncodeSubmitted(*accepted)
                         : wire::EncodeRejected(accepted.status());
  }

  // The answer to one POST packet: a prepared transfer of the connection's session posted
  // (options_.post), answered as a SUBMIT; its end goes to the session's completion queue.
  std::string Post(absl::string_view body, const std::shared_ptr<Connection>& conn) {
    if (!options_.post) {
      return wire::EncodeRejected(
          absl::UnimplementedError("POST: this daemon takes prepared transfers over gRPC only"));
    }
    absl::StatusOr<v1::PostTransferRequest> parsed = wire::ParsePostBody(body);
    if (!parsed.ok()) return wire::EncodeRejected(parsed.status());
    absl::StatusOr<v1::SubmitTransferResponse> accepted = AdmitPost(*parsed, conn, 0);
    return accepted.ok() ? wire::EncodeSubmitted(*accepted)
                         : wire::EncodeRejected(accepted.status());
  }

  // Posts a prepared transfer of `conn`'s session (a POST packet's or a kPostKind entry's, `tag`
  // its tag); its end goes to the session's completion queue when it has one.
  absl::StatusOr<v1::SubmitTransferResponse> AdmitPost(const v1::PostTransferRequest& post,
                                                       const std::shared_ptr<Connection>& conn,
                                                       uint64_t tag) {
    if (!options_.post) {
      return absl::UnimplementedError("POST: this daemon takes prepared transfers over gRPC only");
    }
    sessions::Caller caller;
    caller.session_id = conn->id;
    absl::StatusOr<v1::SubmitTransferResponse> accepted = options_.post(caller, post);
    if (!accepted.ok()) {
      spdlog::info("post rejected (session): {}", accepted.status().ToString());
      return accepted.status();
    }
    if (auto sink = conn->Completions()) PostWhenDone(*conn, sink, accepted->transfer_id(), tag);
    return accepted;
  }

  // Admits a parsed request of `conn`'s session (a SUBMIT packet's or a submission queue
  // entry's, `tag` its tag): the connection's session is the submitter, whatever the spec
  // claims, and the transfer's end goes to the session's completion queue when it has one.
  absl::StatusOr<v1::SubmitTransferResponse> Admit(v1::SubmitTransferRequest request,
                                                   const std::shared_ptr<Connection>& conn,
                                                   uint64_t tag) {
    request.mutable_spec()->set_session_id(conn->id);
    absl::StatusOr<v1::SubmitTransferResponse> accepted = options_.submit(request.spec());
    if (!accepted.ok()) {
      spdlog::info("transfer rejected (session submit): {}", accepted.status().ToString());
      return accepted.status();
    }
    if (auto sink = conn->Completions()) PostWhenDone(*conn, sink, accepted->transfer_id(), tag);
    return accepted;
  }

  // --- Submission queues ---

  // "SQ" with a submission queue's four descriptors: mapped, checked, and watched by the poll
  // thread from now on. Answers "SQ OK" or REJECTED.
  std::string MapSubmissionQueue(int fd, Connection* conn, std::vector<UniqueFd> fds,
                                 bool truncated) {
    if (!options_.submission_queue || !options_.submit) {
      return wire::EncodeRejected(absl::UnimplementedError(
          "SQ: this daemon takes no submission queues (DaemonConfig.session_submission_queue)"));
    }
    if (fds.size() != 4 || truncated) {
      return wire::EncodeRejected(absl::InvalidArgumentError(
          "SQ: expected the packet \"SQ\" carrying exactly four descriptors (sq memfd, sq "
          "eventfd, ack memfd, ack eventfd)"));
    }
    if (conn->intake != nullptr) {
      return wire::EncodeRejected(
          absl::AlreadyExistsError("SQ: this session already has a submission queue"));
    }
    for (const UniqueFd& passed : fds) {
      if (ShortOfFds(passed.get(), options_.fd_headroom)) {
        return wire::EncodeRejected(ShortOfFdsError());
      }
    }
    absl::StatusOr<std::unique_ptr<SubmissionIntake>> intake =
        SubmissionIntake::Attach(std::move(fds));
    if (!intake.ok()) return wire::EncodeRejected(intake.status());
    if (absl::Status watched = WatchSubmissions(fd, conn, *std::move(intake)); !watched.ok()) {
      return wire::EncodeRejected(watched);
    }
    spdlog::debug("session {}: submission queue mapped", conn->id);
    return wire::kSubmissionQueueAccepted;
  }

  // Watches the queue's eventfd (tagged with the connection's fd number). Its need_wake rests
  // set: the client rings the eventfd unless the poll thread is looking at the queue.
  absl::Status WatchSubmissions(int fd, Connection* conn,
                                std::unique_ptr<SubmissionIntake> intake) {
    if (!Watch(intake->sq_eventfd(), kSubmissionTag | static_cast<uint64_t>(fd))) {
      return absl::ResourceExhaustedError(
          absl::StrCat("SQ: the daemon cannot watch the queue: ", std::strerror(errno)));
    }
    conn->intake = std::move(intake);
    // Entries published before it was watched (a hot restart's) are read at the next look.
    queues_.Add(fd, conn->intake);
    return absl::OkStatus();
  }

  // One round of the submission queues (SubmissionQueues::Look); whether entries came.
  bool LookAtQueues(bool may_spin) {
    return queues_.Look(
        kMaxEntriesPerLook, may_spin,
        [this](int fd, std::vector<SubmissionIntake::Entry> entries) {
          auto it = sessions_.find(fd);
          if (it != sessions_.end()) AdmitEntries(it->second, std::move(entries));
        },
        [this](int fd, const absl::Status& status) {
          auto it = sessions_.find(fd);
          if (it == sessions_.end()) return;
          spdlog::warn("session {}: submission queue broken ({}); its entries are no longer read",
                       it->second->id, status.ToString());
          ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second->intake->sq_eventfd(), nullptr);
        });
  }

  // Admits the entries of one look, in order, and acknowledges each: on the poll thread when
  // they are few and small and the session has nothing queued (as a small SUBMIT: parsed here
  // only then, never more than kMaxInlineSubmitBytes), else as one task of the session's
  // admission queue (after its earlier packets), which parses them.
  void AdmitEntries(const std::shared_ptr<Connection>& conn,
                    std::vector<SubmissionIntake::Entry> entries) {
    std::shared_ptr<SubmissionIntake> intake = conn->intake;
    size_t payload = 0;
    for (const SubmissionIntake::Entry& entry : entries) payload += entry.payload_bytes;
    if (admission_ == nullptr ||
        (entries.size() <= kMaxInlineEntries && payload <= kMaxInlineSubmitBytes &&
         options_.max_inline_submit_ids > 0 && admission_->Idle(conn->id))) {
      std::vector<ParsedEntry> parsed;
      parsed.reserve(entries.size());
      bool inline_ok = true;
      for (const SubmissionIntake::Entry& entry : entries) {
        parsed.push_back(ParseEntry(entry));
        inline_ok = inline_ok && AdmitsInlineEntry(parsed.back());
      }
      if (admission_ == nullptr || inline_ok) {
        for (size_t i = 0; i < entries.size(); ++i) {
          AdmitEntry(entries[i].tag, std::move(parsed[i]), conn, *intake);
        }
        return;
      }
    }
    auto taken = std::make_shared<std::vector<SubmissionIntake::Entry>>(std::move(entries));
    auto admit_all = [this, conn, intake, taken]() {
      for (const SubmissionIntake::Entry& entry : *taken) {
        AdmitEntry(entry.tag, ParseEntry(entry), conn, *intake);
      }
    };
    absl::Status queued = admission_->Post(conn->id, std::move(admit_all));
    if (!queued.ok()) {
      // Refused at once (the session's admission queue is full): every entry is answered.
      for (const SubmissionIntake::Entry& entry : *taken) {
        wire::SubmitAck ack;
        ack.tag = entry.tag;
        ack.code = static_cast<int32_t>(queued.code());
        ack.message = std::string(queued.message());
        intake->PostAck(ack);
      }
    }
  }

  // An entry's request: a submit, or the post of a prepared transfer (a kPostKind entry), or
  // its refusal naming the field.
  struct ParsedEntry {
    absl::StatusOr<v1::SubmitTransferRequest> request =
        absl::Status(absl::StatusCode::kUnknown, "");
    std::optional<v1::PostTransferRequest> post;  // a kPostKind entry (request unused)
  };
  static ParsedEntry ParseEntry(const SubmissionIntake::Entry& entry) {
    ParsedEntry p;
    if (!entry.refused.ok()) {
      p.request = entry.refused;
      return p;
    }
    const absl::string_view bytes = entry.payload();
    if (entry.kind == wire::kPostKind) {
      v1::PostTransferRequest post;
      if (post.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        p.post = std::move(post);
      } else {
        p.request =
            absl::InvalidArgumentError("sq.entry.payload: not a serialized PostTransferRequest");
      }
      return p;
    }
    v1::SubmitTransferRequest request;
    if (request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      p.request = std::move(request);
    } else {
      p.request =
          absl::InvalidArgumentError("sq.entry.payload: not a serialized SubmitTransferRequest");
    }
    return p;
  }

  // Whether a parsed entry is small enough to admit on the poll thread (a refusal is).
  bool AdmitsInlineEntry(const ParsedEntry& p) const {
    if (p.post.has_value()) {
      return static_cast<size_t>(p.post->src_block_ids_size()) + p.post->dst_block_ids_size() <=
             options_.max_inline_submit_ids;
    }
    return !p.request.ok() || AdmitsInline(p.request->spec(), options_.max_inline_submit_ids);
  }

  // Admits one entry's request and posts its acknowledgement.
  void AdmitEntry(uint64_t tag, ParsedEntry p, const std::shared_ptr<Connection>& conn,
                  SubmissionIntake& intake) {
    wire::SubmitAck ack;
    ack.tag = tag;
    absl::StatusOr<v1::SubmitTransferResponse> accepted =
        p.post.has_value() ? AdmitPost(*p.post, conn, tag)
        : p.request.ok()   ? Admit(*std::move(p.request), conn, tag)
                           : absl::StatusOr<v1::SubmitTransferResponse>(p.request.status());
    if (accepted.ok()) {
      ack.transfer_id = accepted->transfer_id();
      ack.bytes_total = accepted->bytes_total();
      ack.tiles_total = accepted->tiles_total();
      ack.flags = accepted->deduplicated() ? wire::kSubmitAckDeduplicated : 0;
    } else {
      ack.code = static_cast<int32_t>(accepted.status().code());
      ack.message = std::string(accepted.status().message());
    }
    intake.PostAck(ack);
  }

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

}  // namespace

std::string NewInstanceId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(random(), absl::kZeroPad8));
  return id;
}

absl::StatusOr<std::unique_ptr<SessionServer>> SessionServer::Start(
    const std::string& path, uint32_t mode, sessions::SessionTable* sessions,
    const std::string& instance_id, SubmitFn submit, WaitFn wait) {
  SessionServerOptions options;
  options.path = path;
  options.mode = mode;
  options.instance_id = instance_id;
  options.submit = std::move(submit);
  if (wait) {
    options.wait = [wait = std::move(wait)](const sessions::Caller&, uint64_t id,
                                            std::function<void(const v1::TransferStatus&)> done) {
      return wait(id, std::move(done));
    };
  }
  return Start(options, sessions);
}

absl::StatusOr<std::unique_ptr<SessionServer>> SessionServer::Start(
    const SessionServerOptions& options, sessions::SessionTable* sessions) {
  const std::string& path = options.path;
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix_socket: session socket path '", path, "' is empty or too long"));
  }
  UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener.valid()) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // Bound in a private directory and renamed into place with its mode (never with the umask's).
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<server::PrivateBind> bind,
                          server::PrivateBind::Create(path));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, bind->bind_path().c_str(), bind->bind_path().size() + 1);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("unix_socket: cannot bind ", path, ": ", std::strerror(errno)));
  }
  if (::listen(listener.get(), 128) != 0) {
    return absl::InternalError(absl::StrCat("listen ", path, ": ", std::strerror(errno)));
  }
  KVRAIL_RETURN_IF_ERROR(bind->Publish(options.mode));
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  UniqueFd wake_read(pipe_fds[0]), wake_write(pipe_fds[1]);
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return absl::InternalError(absl::StrCat("epoll: ", std::strerror(errno)));
  auto server = std::make_unique<SessionServerImpl>(std::move(listener), std::move(wake_read),
                                                    std::move(wake_write), std::move(epoll),
                                                    sessions, options);
  server->Resume();
  return std::unique_ptr<SessionServer>(std::move(server));
}

absl::StatusOr<std::unique_ptr<SessionServer>> SessionServer::Adopt(
    const SessionServerOptions& options, sessions::SessionTable* sessions,
    const handover::SessionServerState& state, std::vector<UniqueFd>* fds) {
  KVRAIL_ASSIGN_OR_RETURN(UniqueFd listener,
                          SessionServerImpl::TakeHanded(fds, state.listener_fd(), "listener_fd"));
  int type = 0;
  socklen_t len = sizeof(type);
  if (::getsockopt(listener.get(), SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
      type != SOCK_SEQPACKET) {
    return absl::InvalidArgumentError("handover: listener_fd is not a SOCK_SEQPACKET socket");
  }
  // accept4 on it must not block the poll thread.
  const int flags = ::fcntl(listener.get(), F_GETFL);
  if (flags < 0 || ::fcntl(listener.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("handover: listener_fd: ", std::strerror(errno)));
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  UniqueFd wake_read(pipe_fds[0]), wake_write(pipe_fds[1]);
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return absl::InternalError(absl::StrCat("epoll: ", std::strerror(errno)));
  auto server = std::make_unique<SessionServerImpl>(std::move(listener), std::move(wake_read),
                                                    std::move(wake_write), std::move(epoll),
                                                    sessions, options);
  KVRAIL_RETURN_IF_ERROR(server->AdoptConnections(state, fds));
  return std::unique_ptr<SessionServer>(std::move(server));
}

}  // namespace kvrail::session
