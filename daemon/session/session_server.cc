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
#include <string_view>
#include <memory>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "spdlog/spdlog.h"

namespace kvrail::session {
namespace {

void SendPacket(int fd, const std::string& text) {
  // A client that stopped reading only loses its own answer.
  (void)::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

class SessionServerImpl final : public SessionServer {
 public:
  SessionServerImpl(UniqueFd listener, UniqueFd wake_read, UniqueFd wake_write,
                    regions::RegionTable* regions, SubmitFn submit, WaitFn wait)
      : listener_(std::move(listener)),
        wake_read_(std::move(wake_read)),
        wake_write_(std::move(wake_write)),
        regions_(regions),
        submit_(std::move(submit)),
        wait_(std::move(wait)),
        packet_(kMaxPacket) {
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
    SendPacket(fd.get(), absl::StrCat("SESSION ", id));
    spdlog::debug("session {} opened", id);
    const int raw = fd.get();
    sessions_.emplace(raw, std::make_shared<Connection>(id, std::move(fd)));
    count_.store(sessions_.size());
  }

  // Reads one packet from a session; a closed or broken connection ends the session.
  void Serve(int fd) {
    char* const payload = packet_.data();
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    iovec iov{payload, packet_.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    // Collect every descriptor received so none leaks, whatever the packet says.
    std::vector<UniqueFd> received;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int rfd;
          std::memcpy(&rfd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          received.emplace_back(rfd);
        }
      }
    }
    auto it = sessions_.find(fd);
    if (n <= 0) {
      spdlog::debug("session {} closed", it->second->id);
      it->second->Close();
      regions_->EndSession(it->second->id);
      sessions_.erase(it);
      count_.store(sessions_.size());
      return;
    }
    const std::shared_ptr<Connection>& conn = it->second;
    const std::string_view text(payload, n);
    const bool plain = received.empty() && (msg.msg_flags & MSG_TRUNC) == 0;
    if (text.substr(0, kSubmit.size()) == kSubmit) {
      conn->Send(plain ? Submit(text.substr(kSubmit.size()))
                       : Rejected(absl::InvalidArgumentError(absl::StrCat(
                             "SUBMIT: the packet is larger than ", kMaxPacket,
                             " bytes or carries descriptors; use SubmitTransfer"))));
      return;
    }
    if (text.substr(0, kWait.size()) == kWait) {
      Wait(conn, plain, text.substr(kWait.size()));
      return;
    }
    if (text != "FD" || received.size() != 1 ||
        (msg.msg_flags & MSG_CTRUNC) != 0) {
      conn->Send("ERROR expected the packet \"FD\" carrying exactly one descriptor");
      return;
    }
    absl::StatusOr<std::string> token = regions_->AddFd(conn->id, std::move(received[0]));
    conn->Send(token.ok() ? absl::StrCat("TOKEN ", *token)
                          : absl::StrCat("ERROR ", token.status().message()));
  }

  static std::string Rejected(const absl::Status& status) {
    return absl::StrCat("REJECTED ", static_cast<int>(status.code()), " ", status.message());
  }

  // WAIT <id>: answered with DONE when the transfer ends, from the thread that ends it (at once
  // when it has ended), or REJECTED at once. The poll thread never waits.
  void Wait(const std::shared_ptr<Connection>& conn, bool plain, std::string_view id_text) {
    uint64_t id = 0;
    const absl::string_view digits(id_text.data(), id_text.size());
    if (!plain || !absl::SimpleAtoi(digits, &id)) {
      conn->Send(Rejected(absl::InvalidArgumentError(
          absl::StrCat("WAIT: want \"WAIT <transfer id>\", got \"WAIT ", digits.substr(0, 40), "\""))));
      return;
    }
    if (!wait_) {
      conn->Send(Rejected(absl::UnimplementedError("WAIT: this daemon answers waits over gRPC only")));
      return;
    }
    std::weak_ptr<Connection> weak = conn;
    const absl::Status registered = wait_(id, [weak](const v1::TransferStatus& status) {
      if (auto c = weak.lock()) c->Send(absl::StrCat("DONE ", status.SerializeAsString()));
    });
    if (!registered.ok()) conn->Send(Rejected(registered));
  }

  // The answer to one SUBMIT packet (`request`: the serialized SubmitTransferRequest).
  std::string Submit(std::string_view request) {
    if (!submit_) {
      return Rejected(absl::UnimplementedError("SUBMIT: this daemon takes transfers over gRPC only"));
    }
    v1::SubmitTransferRequest parsed;
    if (!parsed.ParseFromArray(request.data(), static_cast<int>(request.size()))) {
      return Rejected(absl::InvalidArgumentError("SUBMIT: not a serialized SubmitTransferRequest"));
    }
    absl::StatusOr<v1::SubmitTransferResponse> accepted = submit_(parsed.spec());
    if (!accepted.ok()) {
      spdlog::info("transfer rejected (session submit): {}", accepted.status().ToString());
      return Rejected(accepted.status());
    }
    return absl::StrCat("SUBMITTED ", accepted->SerializeAsString());
  }

  // SUBMIT requests carry block tables of up to 8191 ids per side in the message (larger ones
  // go through shared memory), so 256 KiB is ample.
  static constexpr size_t kMaxPacket = 256 << 10;
  static constexpr std::string_view kSubmit = "SUBMIT ";
  static constexpr std::string_view kWait = "WAIT ";

  UniqueFd listener_;
  UniqueFd wake_read_;
  UniqueFd wake_write_;
  regions::RegionTable* const regions_;
  const SubmitFn submit_;
  const WaitFn wait_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> count_{0};
  // Owned by the poll thread only.
  absl::flat_hash_map<int, std::shared_ptr<Connection>> sessions_;
  std::vector<char> packet_;  // receive buffer
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SessionServer>> SessionServer::Start(const std::string& path,
                                                                    uint32_t mode,
                                                                    regions::RegionTable* regions,
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
      std::move(listener), UniqueFd(pipe_fds[0]), UniqueFd(pipe_fds[1]), regions,
      std::move(submit), std::move(wait)));
}

}  // namespace kvrail::session
