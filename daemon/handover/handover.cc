#include "daemon/handover/handover.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "daemon/server/private_bind.h"
#include "spdlog/spdlog.h"

namespace kvrail::handover {
namespace {

constexpr size_t kChunkBytes = 32 << 10;
constexpr size_t kFdsPerPacket = 64;
constexpr size_t kMaxPacketBytes = kChunkBytes + 64;
// The state of a node with every cap reached stays far below this; anything larger is refused.
constexpr uint64_t kMaxStateBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxFds = uint64_t{1} << 22;

constexpr char kHello[] = "HELLO";
constexpr char kBundle[] = "BUNDLE ";
constexpr char kData[] = "DATA";
constexpr char kRefused[] = "REFUSED ";
constexpr char kCommit[] = "COMMIT";
constexpr char kReleased[] = "RELEASED";

absl::Status Errno(absl::string_view what) {
  const int err = errno;
  return absl::Status(absl::ErrnoToStatusCode(err), absl::StrCat(what, ": ", std::strerror(err)));
}

absl::Status SendPacket(int sock, absl::string_view payload, const int* fds = nullptr,
                        size_t count = 0) {
  iovec iov{const_cast<char*>(payload.data()), payload.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (count > 0) {
    control.assign(CMSG_SPACE(count * sizeof(int)), 0);
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(count * sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), fds, count * sizeof(int));
  }
  while (::sendmsg(sock, &msg, MSG_NOSIGNAL) < 0) {
    if (errno != EINTR) return Errno("handover: send");
  }
  return absl::OkStatus();
}

// Waits until `sock` is readable or `until` passes (DEADLINE_EXCEEDED).
absl::Status AwaitReadable(int sock, absl::Time until) {
  while (true) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("handover: the other end did not answer in time");
    }
    pollfd p{sock, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return Errno("handover: poll");
  }
}

// One packet (payload and descriptors); UNAVAILABLE when the other end closed.
struct Packet {
  std::string payload;
  std::vector<UniqueFd> fds;
};

absl::StatusOr<Packet> ReceivePacket(int sock, absl::Time until) {
  KVRAIL_RETURN_IF_ERROR(AwaitReadable(sock, until));
  Packet packet;
  packet.payload.resize(kMaxPacketBytes);
  iovec iov{packet.payload.data(), packet.payload.size()};
  std::vector<char> control(CMSG_SPACE(kFdsPerPacket * sizeof(int)));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  while ((n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0) {
    if (errno != EINTR) return Errno("handover: receive");
  }
  // Descriptors first: they are owned (and closed on every error) from here on.
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      packet.fds.emplace_back(fd);
    }
  }
  if (n == 0) return absl::UnavailableError("handover: the other end closed the connection");
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    return absl::InvalidArgumentError("handover: a packet or its descriptors were truncated");
  }
  packet.payload.resize(static_cast<size_t>(n));
  return packet;
}

absl::StatusOr<uint32_t> PeerUid(int sock) {
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Errno("handover: SO_PEERCRED");
  }
  return cred.uid;
}

absl::Status CheckPeer(int sock) {
  KVRAIL_ASSIGN_OR_RETURN(const uint32_t uid, PeerUid(sock));
  return CheckPeerUid(uid, ::geteuid());
}

// Thread contract: the constructor starts one thread, which alone uses the listener, the
// connection and the callbacks; released_ is read from any thread.
class ListenerImpl final : public Listener {
 public:
  ListenerImpl(std::string path, UniqueFd listener, UniqueFd wake_read, UniqueFd wake_write,
               Predecessor predecessor, absl::Duration commit_timeout)
      : path_(std::move(path)),
        listener_(std::move(listener)),
        wake_read_(std::move(wake_read)),
        wake_write_(std::move(wake_write)),
        predecessor_(std::move(predecessor)),
        commit_timeout_(commit_timeout) {
    thread_ = std::thread([this] { Loop(); });
  }

  ~ListenerImpl() override {
    const char b = 1;
    (void)!::write(wake_write_.get(), &b, 1);
    thread_.join();
    // After a release the path is the successor's handover socket.
    if (!released_.load()) ::unlink(path_.c_str());
  }

  bool released() const override { return released_.load(); }

 private:
  void Loop() {
    while (!released_.load()) {
      pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        spdlog::error("handover socket: poll: {}", std::strerror(errno));
        return;
      }
      if (fds[1].revents != 0) return;
      UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn.valid()) continue;
      const absl::Status status = Serve(conn.get());
      if (released_.load()) {
        spdlog::info("handover: the successor serves now");
        return;
      }
      spdlog::warn("handover: no handover ({}); serving on", status.ToString());
    }
  }

  // One successor, start to end. Once prepare has run, every way out but a commit resumes.
  absl::Status Serve(int conn) {
    if (absl::Status peer = CheckPeer(conn); !peer.ok()) {
      (void)SendPacket(conn, absl::StrCat(kRefused, peer.message()));
      return peer;
    }
    KVRAIL_ASSIGN_OR_RETURN(Packet hello, ReceivePacket(conn, absl::Now() + absl::Seconds(5)));
    if (!absl::StartsWith(hello.payload, kHello)) {
      return absl::InvalidArgumentError("handover: the successor did not say HELLO");
    }
    spdlog::info("handover: a successor asks; pausing, finishing running transfers");
    absl::StatusOr<Bundle> bundle = predecessor_.prepare();
    if (!bundle.ok()) {
      (void)SendPacket(conn, absl::StrCat(kRefused, bundle.status().message()));
      predecessor_.resume();
      return bundle.status();
    }
    absl::Status sent = SendBundle(conn, *bundle);
    bundle->fds.clear();  // this daemon's duplicates; its own descriptors stay
    absl::StatusOr<Packet> answer =
        sent.ok() ? ReceivePacket(conn, absl::Now() + commit_timeout_) : sent;
    if (answer.ok() && absl::StartsWith(answer->payload, kCommit)) {
      released_.store(true);
      const std::string address = answer->payload.size() > sizeof(kCommit)
                                      ? answer->payload.substr(sizeof(kCommit))
                                      : std::string();
      predecessor_.released(address);
      (void)SendPacket(conn, kReleased);
      return absl::OkStatus();
    }
    predecessor_.resume();
    if (!answer.ok()) return answer.status();
    return absl::FailedPreconditionError(
        absl::StrCat("handover: the successor gave up: ", answer->payload.substr(0, 200)));
  }

  const std::string path_;
  const UniqueFd listener_;
  const UniqueFd wake_read_;
  const UniqueFd wake_write_;
  const Predecessor predecessor_;
  const absl::Duration commit_timeout_;
  std::atomic<bool> released_{false};
  std::thread thread_;
};

// Thread contract: one thread.
class TakeoverImpl final : public Takeover {
 public:
  TakeoverImpl(UniqueFd conn, Bundle bundle) : conn_(std::move(conn)), bundle_(std::move(bundle)) {}

  Bundle& bundle() override { return bundle_; }

  absl::Status Commit(absl::Duration timeout, const std::string& address) override {
    KVRAIL_RETURN_IF_ERROR(SendPacket(
        conn_.get(), address.empty() ? std::string(kCommit) : absl::StrCat(kCommit, " ", address)));
    KVRAIL_ASSIGN_OR_RETURN(Packet answer, ReceivePacket(conn_.get(), absl::Now() + timeout));
    if (answer.payload != kReleased) {
      return absl::FailedPreconditionError(
          absl::StrCat("handover: the predecessor answered the commit with '",
                       answer.payload.substr(0, 200), "'"));
    }
    return absl::OkStatus();
  }

 private:
  const UniqueFd conn_;
  Bundle bundle_;
};

}  // namespace

std::string HandoverSocketPath(const std::string& unix_socket) { return unix_socket + ".handover"; }

absl::Status CheckPeerUid(uint32_t peer_uid, uint32_t own_euid) {
  if (peer_uid == own_euid || peer_uid == 0) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("handover: the other end runs as uid ", peer_uid, ", this kvraild as uid ",
                   own_euid, "; a hot restart is between daemons of the same uid (or root)"));
}

absl::Status SendBundle(int sock, const Bundle& bundle) {
  std::string bytes;
  if (!bundle.state.SerializeToString(&bytes)) {
    return absl::InternalError("handover: the state does not serialize");
  }
  std::vector<int> raw;
  raw.reserve(bundle.fds.size());
  for (const UniqueFd& fd : bundle.fds) {
    if (!fd.valid()) return absl::InternalError("handover: an invalid descriptor in the bundle");
    raw.push_back(fd.get());
  }
  KVRAIL_RETURN_IF_ERROR(SendPacket(sock, absl::StrCat(kBundle, bytes.size(), " ", raw.size())));
  size_t offset = 0, sent_fds = 0;
  while (offset < bytes.size() || sent_fds < raw.size()) {
    const size_t chunk = std::min(kChunkBytes, bytes.size() - offset);
    const size_t count = std::min(kFdsPerPacket, raw.size() - sent_fds);
    KVRAIL_RETURN_IF_ERROR(SendPacket(sock, absl::StrCat(kData, bytes.substr(offset, chunk)),
                                      raw.data() + sent_fds, count));
    offset += chunk;
    sent_fds += count;
  }
  return absl::OkStatus();
}

absl::StatusOr<Bundle> ReceiveBundle(int sock, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  KVRAIL_ASSIGN_OR_RETURN(Packet header, ReceivePacket(sock, until));
  if (absl::StartsWith(header.payload, kRefused)) {
    return absl::FailedPreconditionError(absl::StrCat("handover: the predecessor refused: ",
                                                      header.payload.substr(sizeof(kRefused) - 1)));
  }
  std::vector<std::string> parts = absl::StrSplit(header.payload, ' ');
  uint64_t total_bytes = 0, total_fds = 0;
  if (parts.size() != 3 || parts[0] != "BUNDLE" || !absl::SimpleAtoi(parts[1], &total_bytes) ||
      !absl::SimpleAtoi(parts[2], &total_fds) || total_bytes > kMaxStateBytes ||
      total_fds > kMaxFds) {
    return absl::InvalidArgumentError("handover: the bundle's header is malformed");
  }
  std::string bytes;
  Bundle bundle;
  while (bytes.size() < total_bytes || bundle.fds.size() < total_fds) {
    KVRAIL_ASSIGN_OR_RETURN(Packet packet, ReceivePacket(sock, until));
    if (!absl::StartsWith(packet.payload, kData)) {
      return absl::InvalidArgumentError("handover: a bundle packet without DATA");
    }
    bytes.append(packet.payload, sizeof(kData) - 1, std::string::npos);
    for (UniqueFd& fd : packet.fds) bundle.fds.push_back(std::move(fd));
    if (bytes.size() > total_bytes || bundle.fds.size() > total_fds) {
      return absl::InvalidArgumentError("handover: the bundle holds more than its header says");
    }
  }
  if (!bundle.state.ParseFromString(bytes)) {
    return absl::InvalidArgumentError("handover: the state does not parse");
  }
  return bundle;
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::Start(const std::string& path,
                                                          Predecessor predecessor,
                                                          absl::Duration commit_timeout) {
  sockaddr_un addr{};
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<server::PrivateBind> bind,
                          server::PrivateBind::Create(path));
  if (bind->bind_path().size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("unix_socket: ", path, " is too long"));
  }
  UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return Errno("handover: socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, bind->bind_path().c_str(), bind->bind_path().size() + 1);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno(absl::StrCat("handover: bind ", path));
  }
  if (::listen(listener.get(), 4) != 0) return Errno("handover: listen");
  KVRAIL_RETURN_IF_ERROR(bind->Publish(0600));
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return Errno("handover: pipe");
  return std::unique_ptr<Listener>(new ListenerImpl(path, std::move(listener),
                                                    UniqueFd(pipe_fds[0]), UniqueFd(pipe_fds[1]),
                                                    std::move(predecessor), commit_timeout));
}

absl::StatusOr<std::unique_ptr<Takeover>> Takeover::Begin(const std::string& path,
                                                          absl::Duration timeout) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("take_over: ", path, " is too long"));
  }
  UniqueFd conn(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!conn.valid()) return Errno("handover: socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    return absl::UnavailableError(
        absl::StrCat("take_over: no kvraild hands over at ", path, ": ", std::strerror(err)));
  }
  if (absl::Status peer = CheckPeer(conn.get()); !peer.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("take_over: ", path, ": ", peer.message()));
  }
  KVRAIL_RETURN_IF_ERROR(SendPacket(conn.get(), kHello));
  KVRAIL_ASSIGN_OR_RETURN(Bundle bundle, ReceiveBundle(conn.get(), timeout));
  return std::unique_ptr<Takeover>(new TakeoverImpl(std::move(conn), std::move(bundle)));
}

}  // namespace kvrail::handover
