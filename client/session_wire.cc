#include "client/session_wire.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"

namespace kvrail::client::internal {
namespace {

// Answers are short: ASCII lines, or a serialized SubmitTransferResponse.
constexpr size_t kMaxPacket = 16384;

absl::Status ErrnoStatus(absl::string_view what, int err) {
  const absl::StatusCode code = (err == EAGAIN || err == EWOULDBLOCK)
                                    ? absl::StatusCode::kDeadlineExceeded
                                    : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(what, ": ", strerror(err)));
}

// Sets SO_RCVTIMEO or SO_SNDTIMEO; InfiniteDuration is no limit (a zero timeval to the kernel),
// and a positive timeout never rounds down to that.
void SetSocketTimeout(int sock, int option, absl::Duration timeout) {
  struct timeval tv {};
  if (timeout != absl::InfiniteDuration()) {
    tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
    tv.tv_usec =
        static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout - absl::Seconds(tv.tv_sec)));
    if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
  }
  ::setsockopt(sock, SOL_SOCKET, option, &tv, sizeof(tv));
}

class SessionConnectionImpl final : public SessionConnection {
 public:
  SessionConnectionImpl(UniqueFd sock, uint64_t id, std::string path)
      : sock_(std::move(sock)), id_(id), path_(std::move(path)) {}

  uint64_t session_id() const override { return id_; }
  const std::string& path() const override { return path_; }

  absl::StatusOr<std::string> SendFd(int fd) override {
    bool sent = false;
    absl::StatusOr<std::string> answer = Send("FD", fd, "the token", &sent);
    if (!answer.ok()) return answer.status();
    // Tolerate a trailing newline or NUL from a daemon written with C strings.
    absl::string_view text = absl::StripTrailingAsciiWhitespace(answer->c_str());
    if (absl::ConsumePrefix(&text, "TOKEN ") && !text.empty() &&
        text.find(' ') == absl::string_view::npos) {
      return std::string(text);
    }
    text = absl::StripTrailingAsciiWhitespace(answer->c_str());
    if (absl::ConsumePrefix(&text, "ERROR ")) {
      return absl::FailedPreconditionError(
          absl::StrCat("kvraild refused the fd (session ", id_, "): ", text));
    }
    return absl::InternalError(
        absl::StrCat("session socket ", path_, ": unexpected answer to FD: \"", *answer, "\""));
  }

  absl::StatusOr<std::string> Exchange(const std::string& packet, bool* sent) override {
    return Send(packet, -1, "the answer", sent);
  }

  void SetAnswerTimeout(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    SetSocketTimeout(sock_.get(), SO_RCVTIMEO, timeout);
  }

 private:
  // One request (with `fd` passed when >= 0) and its answer; errors say what was awaited.
  absl::StatusOr<std::string> Send(const std::string& packet, int fd, absl::string_view awaited,
                                   bool* sent) {
    absl::MutexLock lock(&mu_);
    *sent = false;
    if (absl::Status s = SendPacket(sock_.get(), packet, fd); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("session socket ", path_, ": ", s.message()));
    }
    *sent = true;
    absl::StatusOr<std::string> answer = ReceivePacket(sock_.get());
    if (!answer.ok()) {
      return absl::Status(answer.status().code(),
                          absl::StrCat("session socket ", path_, ": waiting for ", awaited, ": ",
                                       answer.status().message()));
    }
    return answer;
  }

  absl::Mutex mu_;  // one request/answer exchange at a time
  UniqueFd sock_;
  const uint64_t id_;
  const std::string path_;
};

}  // namespace

std::string SessionSocketPath(const std::string& grpc_socket_path) {
  return grpc_socket_path + ".session";
}

absl::Status SendPacket(int sock, const std::string& payload, int fd) {
  struct iovec iov;
  iov.iov_base = const_cast<char*>(payload.data());
  iov.iov_len = payload.size();
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  while (true) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<size_t>(n) != payload.size()) {
        return absl::InternalError("short send on a SEQPACKET socket");
      }
      return absl::OkStatus();
    }
    if (errno == EINTR) continue;
    return ErrnoStatus("sendmsg", errno);
  }
}

absl::StatusOr<std::string> ReceivePacket(int sock, UniqueFd* fd) {
  std::string buffer(kMaxPacket, '\0');
  struct iovec iov;
  iov.iov_base = buffer.data();
  iov.iov_len = buffer.size();
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for a few descriptors so that a peer sending too many cannot leak them into us
  // unnoticed: the extras are received and closed.
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  while (true) {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    return ErrnoStatus("recvmsg", errno);
  }
  if (fd != nullptr) *fd = UniqueFd();
  for (struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr;
       cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      memcpy(&received, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      if (fd != nullptr && !fd->valid()) {
        *fd = UniqueFd(received);
      } else {
        ::close(received);
      }
    }
  }
  if (n == 0 && (msg.msg_flags & MSG_TRUNC) == 0 && (fd == nullptr || !fd->valid())) {
    // A zero-length read on SEQPACKET means the peer closed the connection.
    return absl::UnavailableError("connection closed by peer");
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    return absl::InternalError(absl::StrCat("packet longer than ", kMaxPacket, " bytes"));
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return absl::InternalError("ancillary data truncated");
  }
  buffer.resize(static_cast<size_t>(n));
  return buffer;
}

absl::StatusOr<std::unique_ptr<SessionConnection>> SessionConnection::Open(
    const std::string& session_socket_path, absl::Duration timeout) {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (session_socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("session socket path too long (", session_socket_path.size(),
                     " bytes, at most ", sizeof(addr.sun_path) - 1, "): ", session_socket_path));
  }
  memcpy(addr.sun_path, session_socket_path.data(), session_socket_path.size());

  // CLOEXEC: a child we fork must not hold the session (and so our regions) open after we die.
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return ErrnoStatus("socket(AF_UNIX, SOCK_SEQPACKET)", errno);
  SetSocketTimeout(sock.get(), SO_RCVTIMEO, timeout);
  SetSocketTimeout(sock.get(), SO_SNDTIMEO, timeout);
  if (::connect(sock.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat("cannot connect to kvraild's session socket ",
                                               session_socket_path, ": ", strerror(err)));
  }
  absl::StatusOr<std::string> greeting = ReceivePacket(sock.get());
  if (!greeting.ok()) {
    return absl::Status(
        greeting.status().code(),
        absl::StrCat("session socket ", session_socket_path,
                     ": waiting for the SESSION greeting: ", greeting.status().message()));
  }
  absl::string_view text = absl::StripTrailingAsciiWhitespace(greeting->c_str());
  uint64_t id = 0;
  if (!absl::ConsumePrefix(&text, "SESSION ") || !absl::SimpleAtoi(text, &id) || id == 0) {
    return absl::InternalError(absl::StrCat("session socket ", session_socket_path,
                                            ": unexpected greeting \"", *greeting,
                                            "\" (want \"SESSION <id>\")"));
  }
  return std::unique_ptr<SessionConnection>(
      new SessionConnectionImpl(std::move(sock), id, session_socket_path));
}

}  // namespace kvrail::client::internal
