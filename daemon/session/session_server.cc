#include "daemon/session/session_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"

namespace kvrail::session {
namespace {

void SendPacket(int fd, const std::string& text) {
  // A client that stopped reading only loses its own answer.
  (void)wire::SendPacket(fd, text, -1, MSG_DONTWAIT);
}

class SessionServerImpl final : public SessionServer {
 public:
  SessionServerImpl(UniqueFd listener, UniqueFd wake_read, UniqueFd wake_write,
                    regions::RegionTable* regions, std::string instance_id, SubmitFn submit,
                    WaitFn wait)
      : listener_(std::move(listener)),
        wake_read_(std::move(wake_read)),
        wake_write_(std::move(wake_write)),
        regions_(regions),
        instance_id_(std::move(instance_id)),
        submit_(std::move(submit)),
        wait_(std::move(wait)),
        packet_(wire::kMaxRequestBytes) {
    thread_ = std::thread([this] { Loop(); });
  }

  ~SessionServerImpl() override {
    stop_.store(true);
    const char b = 1;
    (void)::write(wake_write_.get(), &b, 1);
    thread_.join();
    for (auto& [fd, session] : sessions_) {
      session->Close();
      regions_->EndSession(session->id);
    }
  }

  size_t active_sessions() const override { return count_.load(); }

 private:
  // One client connection. Answers to WAIT are sent from whichever thread ends the transfer, so
  // sends and the close are serialized here; after the close nothing is sent (the fd number may
  // already belong to another connection).
  struct Connection {
    Connection(uint64_t session_id, UniqueFd socket) : id(session_id), fd(std::move(socket)) {}
    void Send(const std::string& text) {
      absl::MutexLock lock(&mu);
      if (fd.valid()) SendPacket(fd.get(), text);
    }
    void Close() {
      absl::MutexLock lock(&mu);
      fd = UniqueFd();
    }
    const uint64_t id;
    absl::Mutex mu;
    UniqueFd fd ABSL_GUARDED_BY(mu);
  };

  void Loop() {
    while (!stop_.load()) {
      std::vector<pollfd> fds;
      fds.push_back({wake_read_.get(), POLLIN, 0});
      fds.push_back({listener_.get(), POLLIN, 0});
      for (const auto& [fd, session] : sessions_) fds.push_back({fd, POLLIN, 0});
      const int n = ::poll(fds.data(), fds.size(), -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        spdlog::error("session socket: poll failed: {}", std::strerror(errno));
        return;
      }
      if (fds[1].revents & POLLIN) Accept();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents != 0) Serve(fds[i].fd);
      }
    }
  }

  void Accept() {
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) return;
    const uint64_t id = regions_->BeginSession();
    // The connection's process (SO_PEERCRED) decides whether the session is the operator's.
    struct ucred cred {};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      regions_->SetSessionPeer(id, cred.uid);
    }
    // The secret goes to this connection only: it binds the client's gRPC calls to the session.
    SendPacket(fd.get(), wire::EncodeGreeting(id, instance_id_, regions_->SessionSecret(id)));
    spdlog::debug("session {} opened", id);
    const int raw = fd.get();
    sessions_.emplace(raw, std::make_shared<Connection>(id, std::move(fd)));
    count_.store(sessions_.size());
  }

  // Reads one packet from a session; a closed or broken connection ends the session, a packet
  // that could not be read whole (too many descriptors) is answered with ERROR.
  void Serve(int fd) {
    auto it = sessions_.find(fd);
    const std::shared_ptr<Connection> conn = it->second;
    absl::StatusOr<wire::Received> received = wire::ReceiveMessage(fd, &packet_, MSG_DONTWAIT);
    if (!received.ok()) {
      switch (received.status().code()) {
        case absl::StatusCode::kDeadlineExceeded:  // nothing to read after all
          return;
        case absl::StatusCode::kUnavailable:  // closed, reset or broken
          spdlog::debug("session {} closed: {}", conn->id, std::string(received.status().message()));
          conn->Close();
          regions_->EndSession(conn->id);
          sessions_.erase(it);
          count_.store(sessions_.size());
          return;
        default:
          conn->Send(wire::EncodeError(received.status().message()));
          return;
      }
    }
    // Every descriptor received is owned by `received` and closed unless handed on below.
    const bool plain = received->fds.empty() && !received->truncated;
    const wire::Request request = wire::ParseRequest(received->payload);
    switch (request.kind) {
      case wire::RequestKind::kSubmit:
        conn->Send(plain ? Submit(request.body, conn->id)
                         : wire::EncodeRejected(absl::InvalidArgumentError(absl::StrCat(
                               "SUBMIT: the packet is larger than ", wire::kMaxRequestBytes,
                               " bytes or carries descriptors; use SubmitTransfer"))));
        return;
      case wire::RequestKind::kWait:
        Wait(conn, plain, request.body);
        return;
      case wire::RequestKind::kFd:
        if (received->fds.size() == 1) break;
        [[fallthrough]];
      case wire::RequestKind::kOther:
        conn->Send(wire::EncodeError("expected the packet \"FD\" carrying exactly one descriptor"));
        return;
    }
    absl::StatusOr<std::string> token = regions_->AddFd(conn->id, std::move(received->fds[0]));
    conn->Send(token.ok() ? wire::EncodeToken(*token) : wire::EncodeError(token.status().message()));
  }

  // WAIT <id>: answered with DONE when the transfer ends, from the thread that ends it (at once
  // when it has ended), or REJECTED at once. The poll thread never waits.
  void Wait(const std::shared_ptr<Connection>& conn, bool plain, absl::string_view body) {
    const absl::StatusOr<uint64_t> id = wire::ParseWaitBody(body, plain);
    if (!id.ok()) {
      conn->Send(wire::EncodeRejected(id.status()));
      return;
    }
    if (!wait_) {
      conn->Send(wire::EncodeRejected(
          absl::UnimplementedError("WAIT: this daemon answers waits over gRPC only")));
      return;
    }
    std::weak_ptr<Connection> weak = conn;
    const absl::Status registered = wait_(*id, [weak](const v1::TransferStatus& status) {
      if (auto c = weak.lock()) c->Send(wire::EncodeDone(status));
    });
    if (!registered.ok()) conn->Send(wire::EncodeRejected(registered));
  }

  // The answer to one SUBMIT packet (`request`: the serialized SubmitTransferRequest).
  std::string Submit(absl::string_view body, uint64_t session_id) {
    if (!submit_) {
      return wire::EncodeRejected(
          absl::UnimplementedError("SUBMIT: this daemon takes transfers over gRPC only"));
    }
    absl::StatusOr<v1::SubmitTransferRequest> parsed = wire::ParseSubmitBody(body);
    if (!parsed.ok()) return wire::EncodeRejected(parsed.status());
    // The submitter is this connection's session, whatever the spec claims.
    parsed->mutable_spec()->set_session_id(session_id);
    absl::StatusOr<v1::SubmitTransferResponse> accepted = submit_(parsed->spec());
    if (!accepted.ok()) {
      spdlog::info("transfer rejected (session submit): {}", accepted.status().ToString());
      return wire::EncodeRejected(accepted.status());
    }
    return wire::EncodeSubmitted(*accepted);
  }

  UniqueFd listener_;
  UniqueFd wake_read_;
  UniqueFd wake_write_;
  regions::RegionTable* const regions_;
  const std::string instance_id_;
  const SubmitFn submit_;
  const WaitFn wait_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> count_{0};
  // Owned by the poll thread only.
  absl::flat_hash_map<int, std::shared_ptr<Connection>> sessions_;
  wire::ReceiveBuffer packet_;  // the poll thread's receive buffer
  std::thread thread_;
};

}  // namespace

std::string NewInstanceId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(random(), absl::kZeroPad8));
  return id;
}

absl::StatusOr<std::unique_ptr<SessionServer>> SessionServer::Start(const std::string& path,
                                                                    uint32_t mode,
                                                                    regions::RegionTable* regions,
                                                                    const std::string& instance_id,
                                                                    SubmitFn submit,
                                                                    WaitFn wait) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix_socket: session socket path '", path, "' is empty or too long"));
  }
  UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ::unlink(path.c_str());
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("unix_socket: cannot bind ", path, ": ", std::strerror(errno)));
  }
  if (::chmod(path.c_str(), mode) != 0) {
    return absl::InternalError(absl::StrCat("chmod ", path, ": ", std::strerror(errno)));
  }
  if (::listen(listener.get(), 128) != 0) {
    return absl::InternalError(absl::StrCat("listen ", path, ": ", std::strerror(errno)));
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  return std::unique_ptr<SessionServer>(std::make_unique<SessionServerImpl>(
      std::move(listener), UniqueFd(pipe_fds[0]), UniqueFd(pipe_fds[1]), regions, instance_id,
      std::move(submit), std::move(wait)));
}

}  // namespace kvrail::session
