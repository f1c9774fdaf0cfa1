// The session server's set-up and teardown (session_server_impl.h lists its parts): Start and
// Adopt, the destructor, Pause / Resume and the handover's export and adoption.
#include "daemon/session/session_server.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "daemon/server/private_bind.h"
#include "daemon/session/admission.h"
#include "daemon/session/session_server_impl.h"
#include "daemon/session/session_sinks.h"
#include "daemon/session/submission_intake.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"
#include "wire/shm_ring.h"

namespace kvrail::session {

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

SessionServerImpl::SessionServerImpl(UniqueFd listener, UniqueFd wake_read, UniqueFd wake_write,
                                     UniqueFd epoll, sessions::SessionTable* sessions,
                                     SessionServerOptions options)
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
    const absl::Duration deadline = options_.admission_bulk_deadline;
    const BulkPlan bulk =
        PlanBulkWorkers(options_.admission_bulk_workers, deadline,
                        options_.admission_bulk_workers == 0 || deadline <= absl::ZeroDuration() ||
                            CanLeaveBackground());
    if (!bulk.why.empty()) spdlog::warn("session admission: {}", bulk.why);
    admission_ = std::make_unique<AdmissionPool>(
        options_.admission_workers, options_.max_queued_per_session, bulk.workers, deadline);
  }
  reserve_ = OpenReserve();
  if (!Watch(wake_read_.get(), kWakeTag) || !Watch(listener_.get(), kListenerTag)) {
    spdlog::error("session socket: epoll_ctl failed: {}", std::strerror(errno));
  }
}

SessionServerImpl::~SessionServerImpl() {
  StopPolling();
  // Admissions running finish (their answers go out), queued ones are dropped unrun, and the
  // sessions closed while one of theirs ran are ended, before the open ones are below.
  admission_.reset();
  for (auto& [fd, session] : sessions_) {
    session->Close();
    table_->EndSession(session->id);
  }
}

size_t SessionServerImpl::active_sessions() const { return count_.load(); }

size_t SessionServerImpl::admissions_queued() const {
  return admission_ != nullptr ? admission_->queued() : 0;
}

SessionServer::AdmissionDepth SessionServerImpl::admission_depth() const {
  AdmissionDepth depth;
  if (admission_ != nullptr) {
    depth.queued = admission_->queued();
    depth.running = admission_->running();
    depth.deepest = admission_->deepest();
    depth.promoted = admission_->promoted();
  }
  return depth;
}

void SessionServerImpl::Pause() {
  StopPolling();
  // Nothing is posted any more: the packets already read are served (SUBMITs admitted and
  // answered), so a handover leaves none of them behind.
  if (admission_ != nullptr) admission_->AwaitIdle();
}

void SessionServerImpl::Resume() {
  if (thread_.joinable()) return;
  stop_.store(false);
  thread_ = std::thread([this] { Loop(); });
}

void SessionServerImpl::StopPolling() {
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

UniqueFd SessionServerImpl::OpenReserve() {
  return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

absl::Status SessionServerImpl::ExportState(handover::SessionServerState* out,
                                            std::vector<UniqueFd>* fds) const {
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

absl::Status SessionServerImpl::AdoptConnections(const handover::SessionServerState& state,
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

absl::StatusOr<UniqueFd> SessionServerImpl::TakeHanded(std::vector<UniqueFd>* fds, int32_t index,
                                                       absl::string_view field) {
  if (index < 0 || static_cast<size_t>(index) >= fds->size() || !(*fds)[index].valid()) {
    return absl::InvalidArgumentError(absl::StrCat("handover: ", field, ": descriptor ", index,
                                                   " is not in the bundle (or used twice)"));
  }
  return std::move((*fds)[index]);
}

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
