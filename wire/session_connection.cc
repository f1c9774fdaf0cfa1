// The client's end of the session socket (SessionConnection in wire/session_wire.h).
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/spin_pause.h"
#include "wire/session_wire.h"

namespace kvrail::wire {
namespace {

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

// `status` with "session socket PATH: " (and what was awaited, when given) in front.
absl::Status InContext(const absl::Status& status, absl::string_view path,
                       absl::string_view awaited = "") {
  return absl::Status(
      status.code(),
      absl::StrCat("session socket ", path, ": ",
                   awaited.empty() ? "" : absl::StrCat("waiting for ", awaited, ": "),
                   status.message()));
}

// Thread contract: see SessionConnection; mu_ serialises whole exchanges.
class SessionConnectionImpl final : public SessionConnection {
 public:
  SessionConnectionImpl(UniqueFd sock, uint64_t id, std::string path, std::string instance,
                        std::string secret)
      : raw_sock_(sock.get()),
        sock_(std::move(sock)),
        id_(id),
        path_(std::move(path)),
        instance_(std::move(instance)),
        secret_(std::move(secret)) {}

  uint64_t session_id() const override { return id_; }
  const std::string& path() const override { return path_; }
  const std::string& instance_id() const override { return instance_; }
  const std::string& secret() const override { return secret_; }

  bool PeerClosed() const override {
    struct pollfd p = {raw_sock_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

  absl::StatusOr<bool> WaitForClose(int wake_fd) const override {
    // POLLIN is not asked for on the session socket: answers arriving for other threads'
    // exchanges do not wake this wait (hang-ups are reported whatever is asked).
    struct pollfd p[2] = {{raw_sock_, POLLRDHUP, 0}, {wake_fd, POLLIN, 0}};
    while (true) {
      const int n = ::poll(p, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::InternalError(
            absl::StrCat("session socket ", path_, ": poll: ", strerror(errno)));
      }
      if ((p[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
      if (p[1].revents != 0) return false;
    }
  }

  absl::StatusOr<std::string> SendFd(int fd) override {
    bool sent = false;
    absl::StatusOr<std::string> answer = Send(kFdRequest, fd, "the token", &sent);
    if (!answer.ok()) return answer.status();
    absl::StatusOr<std::string> token = ParseTokenAnswer(*answer);
    if (token.ok()) return token;
    if (token.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(
          absl::StrCat("kvraild refused the fd (session ", id_, "): ", token.status().message()));
    }
    return InContext(token.status(), path_);
  }

  absl::StatusOr<std::string> Exchange(const std::string& packet, bool* sent) override {
    return Send(packet, -1, "the answer", sent);
  }

  absl::Status SendCompletionQueue(int memfd, int eventfd) override {
    const int fds[2] = {memfd, eventfd};
    return SendQueue(kCompletionQueueRequest, kCompletionQueueAccepted, fds, 2,
                     "completion queues");
  }

  absl::Status SendSubmissionQueue(int sq_memfd, int sq_eventfd, int ack_memfd,
                                   int ack_eventfd) override {
    const int fds[4] = {sq_memfd, sq_eventfd, ack_memfd, ack_eventfd};
    return SendQueue(kSubmissionQueueRequest, kSubmissionQueueAccepted, fds, 4,
                     "submission queues");
  }

  void SetAnswerTimeout(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    SetSocketTimeout(sock_.get(), SO_RCVTIMEO, timeout);
  }

  void SetAnswerSpin(absl::Duration spin) override {
    absl::MutexLock lock(&mu_);
    spin_ = spin;
  }

  uint64_t answer_spin_polls() const override {
    return spin_polls_.load(std::memory_order_relaxed);
  }

 private:
  // "CQ" / "SQ" with their descriptors: OK for `accepted`, the REJECTED status, UNIMPLEMENTED for
  // anything else (a daemon that does not know the request).
  absl::Status SendQueue(const char* request, const char* accepted, const int* fds, size_t count,
                         absl::string_view what) {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = SendPacketFds(sock_.get(), request, fds, count); !s.ok()) {
      return InContext(s, path_);
    }
    absl::StatusOr<std::string> answer = ReceivePacket(sock_.get());
    if (!answer.ok())
      return InContext(answer.status(), path_, absl::StrCat("the ", request, " answer"));
    if (*answer == accepted) return absl::OkStatus();
    if (std::optional<absl::Status> rejected = ParseRejected(*answer)) return *rejected;
    return absl::UnimplementedError(
        absl::StrCat("kvraild does not take ", what, ": ", absl::CEscape(*answer)));
  }

  // One request (with `fd` passed when >= 0) and its answer; errors say what was awaited.
  absl::StatusOr<std::string> Send(absl::string_view packet, int fd, absl::string_view awaited,
                                   bool* sent) {
    absl::MutexLock lock(&mu_);
    *sent = false;
    if (absl::Status s = SendPacket(sock_.get(), packet, fd); !s.ok()) {
      return InContext(s, path_);
    }
    *sent = true;
    if (spin_ > absl::ZeroDuration()) {
      // Polls (no sleep) until the answer is readable or the spin is over; the receive below
      // then finds it at once or sleeps as before.
      // Past its first microseconds the spin yields its CPU between polls (base/spin_pause.h):
      // the thread that answers may be waiting for this very CPU.
      const absl::Time start = absl::Now();
      const absl::Time until = start + spin_;
      struct pollfd p = {sock_.get(), POLLIN, 0};
      for (absl::Time now = start;; now = absl::Now()) {
        spin_polls_.fetch_add(1, std::memory_order_relaxed);
        if (::poll(&p, 1, 0) != 0 || now >= until) break;
        // A contended CPU ends the spin (SpinPause): the receive below sleeps until the
        // answer's wake-up instead.
        if (SpinYields(now - start) && !SpinPause(now - start)) break;
      }
    }
    absl::StatusOr<std::string> answer = ReceivePacket(sock_.get());
    if (!answer.ok()) return InContext(answer.status(), path_, awaited);
    return answer;
  }

  absl::Mutex mu_;  // one request/answer exchange at a time
  // The socket's number, for polls that read nothing (PeerClosed, WaitForClose): sock_ is never
  // replaced, so the number stays this connection's until the object is destroyed.
  const int raw_sock_;
  UniqueFd sock_ ABSL_GUARDED_BY(mu_);
  absl::Duration spin_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::atomic<uint64_t> spin_polls_{0};  // answer_spin_polls()
  const uint64_t id_;
  const std::string path_;
  const std::string instance_;
  const std::string secret_;
};

}  // namespace

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
  if (!sock.valid()) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat("socket(AF_UNIX, SOCK_SEQPACKET): ", strerror(err)));
  }
  SetSocketTimeout(sock.get(), SO_RCVTIMEO, timeout);
  SetSocketTimeout(sock.get(), SO_SNDTIMEO, timeout);
  if (::connect(sock.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat("cannot connect to kvraild's session socket ",
                                               session_socket_path, ": ", strerror(err)));
  }
  absl::StatusOr<std::string> greeting = ReceivePacket(sock.get());
  if (!greeting.ok()) {
    return InContext(greeting.status(), session_socket_path, "the SESSION greeting");
  }
  absl::StatusOr<uint64_t> id = ParseGreeting(*greeting);
  if (!id.ok()) return InContext(id.status(), session_socket_path);
  return std::unique_ptr<SessionConnection>(
      new SessionConnectionImpl(std::move(sock), *id, session_socket_path,
                                ParseGreetingInstance(*greeting), ParseGreetingSecret(*greeting)));
}

}  // namespace kvrail::wire
