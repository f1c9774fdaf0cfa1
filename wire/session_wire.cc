// The session socket's packets and its sendmsg/recvmsg with descriptor passing.
#include "wire/session_wire.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proto/kvrail/v1/spec_copy.h"

namespace kvrail::wire {
namespace {

constexpr absl::string_view kSession = "SESSION ";
constexpr absl::string_view kInstance = "INSTANCE ";
constexpr absl::string_view kSecret = "SECRET ";
constexpr absl::string_view kToken = "TOKEN ";
constexpr absl::string_view kError = "ERROR ";
constexpr absl::string_view kSubmit = "SUBMIT ";
constexpr absl::string_view kSubmitted = "SUBMITTED ";
constexpr absl::string_view kPost = "POST ";
constexpr absl::string_view kWait = "WAIT ";
constexpr absl::string_view kDone = "DONE ";
constexpr absl::string_view kCancel = "CANCEL ";
constexpr absl::string_view kCancelled = "CANCELLED ";
constexpr absl::string_view kCancelledBrief = "CANCELLED_BRIEF ";
constexpr absl::string_view kRejected = "REJECTED ";

absl::Status ErrnoStatus(absl::string_view what, int err) {
  const absl::StatusCode code = (err == EAGAIN || err == EWOULDBLOCK)
                                    ? absl::StatusCode::kDeadlineExceeded
                                    : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(what, ": ", strerror(err)));
}

// Text up to the first NUL, without trailing whitespace: a peer written with C strings may send
// either.
absl::string_view Line(absl::string_view packet) {
  const size_t nul = packet.find('\0');
  if (nul != absl::string_view::npos) packet = packet.substr(0, nul);
  return absl::StripTrailingAsciiWhitespace(packet);
}

// Closes every descriptor an SCM_RIGHTS message in `msg` carries except those taken into `out`.
// Reads only the control bytes the kernel reported (msg_controllen after a successful recvmsg).
void TakeDescriptors(struct msghdr* msg, std::vector<UniqueFd>* out) {
  for (struct cmsghdr* cmsg = CMSG_FIRSTHDR(msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      memcpy(&received, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      out->emplace_back(received);
    }
  }
}

}  // namespace

std::string SessionSocketPath(const std::string& grpc_socket_path) {
  return grpc_socket_path + ".session";
}

// --- Packets -------------------------------------------------------------------------------------

std::string EncodeGreeting(uint64_t session_id, absl::string_view instance_id,
                           absl::string_view secret) {
  std::string greeting = absl::StrCat(kSession, session_id);
  if (!instance_id.empty()) {
    greeting.push_back('\0');
    absl::StrAppend(&greeting, kInstance, instance_id);
  }
  if (!secret.empty()) {
    greeting.push_back('\0');
    absl::StrAppend(&greeting, kSecret, secret);
  }
  return greeting;
}

std::string SessionMetadataValue(uint64_t session_id, absl::string_view secret) {
  return absl::StrCat(session_id, ".", secret);
}

std::optional<std::pair<uint64_t, std::string>> ParseSessionMetadata(absl::string_view value) {
  const size_t dot = value.find('.');
  uint64_t id = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(value.substr(0, dot), &id) || id == 0 ||
      dot + 1 >= value.size()) {
    return std::nullopt;
  }
  return std::make_pair(id, std::string(value.substr(dot + 1)));
}
std::string EncodeToken(absl::string_view token) { return absl::StrCat(kToken, token); }
std::string EncodeError(absl::string_view message) { return absl::StrCat(kError, message); }

std::string EncodeSubmitted(const v1::SubmitTransferResponse& response) {
  return absl::StrCat(kSubmitted, response.SerializeAsString());
}

std::string EncodeDone(const v1::TransferStatus& status) {
  return absl::StrCat(kDone, status.SerializeAsString());
}

std::string EncodeRejected(const absl::Status& status) {
  return absl::StrCat(kRejected, static_cast<int>(status.code()), " ", status.message());
}

std::string EncodeSubmit(const v1::SubmitTransferRequest& request) {
  return absl::StrCat(kSubmit, request.SerializeAsString());
}

std::string EncodePost(const v1::PostTransferRequest& request) {
  return absl::StrCat(kPost, request.SerializeAsString());
}

std::string EncodeWait(uint64_t transfer_id, absl::string_view credential) {
  return credential.empty() ? absl::StrCat(kWait, transfer_id)
                            : absl::StrCat(kWait, transfer_id, " ", credential);
}

std::string EncodeCancel(uint64_t transfer_id) { return absl::StrCat(kCancel, transfer_id); }

Request ParseRequest(absl::string_view packet) {
  Request request{RequestKind::kOther, packet};
  if (absl::ConsumePrefix(&request.body, kSubmit)) {
    request.kind = RequestKind::kSubmit;
  } else if (absl::ConsumePrefix(&request.body, kPost)) {
    request.kind = RequestKind::kPost;
  } else if (absl::ConsumePrefix(&request.body, kWait)) {
    request.kind = RequestKind::kWait;
  } else if (absl::ConsumePrefix(&request.body, kCancel)) {
    request.kind = RequestKind::kCancel;
  } else if (packet == kCompletionQueueRequest) {
    request.kind = RequestKind::kCompletionQueue;
    request.body = absl::string_view();
  } else if (packet == kSubmissionQueueRequest) {
    request.kind = RequestKind::kSubmissionQueue;
    request.body = absl::string_view();
  } else if (packet == kFdRequest) {
    request.kind = RequestKind::kFd;
    request.body = absl::string_view();
  }
  return request;
}

absl::StatusOr<v1::SubmitTransferRequest> ParseSubmitBody(absl::string_view body) {
  v1::SubmitTransferRequest request;
  if (!request.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::InvalidArgumentError("SUBMIT: not a serialized SubmitTransferRequest");
  }
  return request;
}

absl::StatusOr<v1::PostTransferRequest> ParsePostBody(absl::string_view body) {
  v1::PostTransferRequest request;
  if (!request.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::InvalidArgumentError("POST: not a serialized PostTransferRequest");
  }
  return request;
}

absl::StatusOr<uint64_t> ParseWaitBody(absl::string_view body, bool plain) {
  uint64_t id = 0;
  const absl::string_view digits = body.substr(0, body.find(' '));  // before a credential
  if (!plain || !absl::SimpleAtoi(digits, &id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("WAIT: want \"WAIT <transfer id>\", got \"WAIT ", body.substr(0, 40), "\""));
  }
  return id;
}

absl::StatusOr<uint64_t> ParseCancelBody(absl::string_view body, bool plain) {
  uint64_t id = 0;
  if (!plain || body.empty() || !absl::c_all_of(body, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(body, &id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CANCEL: want \"CANCEL <transfer id>\", got \"CANCEL ", body.substr(0, 40), "\""));
  }
  return id;
}

std::optional<std::pair<uint64_t, std::string>> ParseWaitCredential(absl::string_view body) {
  const size_t space = body.find(' ');
  if (space == absl::string_view::npos) return std::nullopt;
  return ParseSessionMetadata(body.substr(space + 1));
}

absl::StatusOr<uint64_t> ParseGreeting(absl::string_view packet) {
  // A daemon at a cap answers the connection with the refusal instead (max_sessions, ...).
  if (std::optional<absl::Status> refused = ParseRejected(packet)) return *refused;
  absl::string_view text = Line(packet);
  uint64_t id = 0;
  if (!absl::ConsumePrefix(&text, kSession) || !absl::SimpleAtoi(text, &id) || id == 0) {
    return absl::InternalError(
        absl::StrCat("unexpected greeting \"", packet, "\" (want \"SESSION <id>\")"));
  }
  return id;
}

namespace {

// The NUL-separated part of a greeting that starts with `key` (alphanumeric, at most 64
// characters), or "".
std::string GreetingPart(absl::string_view packet, absl::string_view key) {
  size_t at = packet.find('\0');
  while (at != absl::string_view::npos) {
    const size_t next = packet.find('\0', at + 1);
    absl::string_view part = packet.substr(
        at + 1, next == absl::string_view::npos ? absl::string_view::npos : next - at - 1);
    absl::string_view text = Line(part);
    if (absl::ConsumePrefix(&text, key)) {
      if (text.empty() || text.size() > 64) return "";
      for (char c : text) {
        if (!absl::ascii_isalnum(static_cast<unsigned char>(c))) return "";
      }
      return std::string(text);
    }
    at = next;
  }
  return "";
}

}  // namespace

std::string ParseGreetingInstance(absl::string_view packet) {
  return GreetingPart(packet, kInstance);
}

std::string ParseGreetingSecret(absl::string_view packet) { return GreetingPart(packet, kSecret); }

absl::StatusOr<std::string> ParseTokenAnswer(absl::string_view packet) {
  absl::string_view text = Line(packet);
  if (absl::ConsumePrefix(&text, kToken) && !text.empty() &&
      text.find(' ') == absl::string_view::npos) {
    return std::string(text);
  }
  text = Line(packet);
  if (absl::ConsumePrefix(&text, kError)) return absl::FailedPreconditionError(text);
  return absl::InternalError(absl::StrCat("unexpected answer to FD: \"", packet, "\""));
}

std::optional<absl::Status> ParseRejected(absl::string_view packet) {
  int code = 0;
  if (!absl::ConsumePrefix(&packet, kRejected)) return std::nullopt;
  const size_t space = packet.find(' ');
  if (space == absl::string_view::npos || !absl::SimpleAtoi(packet.substr(0, space), &code) ||
      code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return std::nullopt;
  }
  return absl::Status(static_cast<absl::StatusCode>(code), packet.substr(space + 1));
}

absl::StatusOr<v1::SubmitTransferResponse> ParseSubmitAnswer(absl::string_view packet) {
  absl::string_view body = packet;
  if (absl::ConsumePrefix(&body, kSubmitted)) {
    v1::SubmitTransferResponse response;
    if (!response.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
      return absl::InternalError("session socket: the SUBMITTED answer does not parse");
    }
    return response;
  }
  if (std::optional<absl::Status> rejected = ParseRejected(packet)) return *rejected;
  return absl::UnimplementedError(
      absl::StrCat("session socket: no SUBMIT here (\"", packet.substr(0, 80), "\")"));
}

absl::StatusOr<v1::TransferStatus> ParseDoneAnswer(absl::string_view packet) {
  absl::string_view body = packet;
  if (absl::ConsumePrefix(&body, kDone)) {
    v1::TransferStatus status;
    if (!status.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
      return absl::InternalError("session socket: the DONE answer does not parse");
    }
    return status;
  }
  if (std::optional<absl::Status> rejected = ParseRejected(packet)) return *rejected;
  return absl::UnimplementedError(
      absl::StrCat("session socket: no WAIT here (\"", packet.substr(0, 80), "\")"));
}

std::string EncodeCancelled(const v1::TransferStatus& status) {
  std::string whole = absl::StrCat(kCancelled, status.SerializeAsString());
  if (whole.size() <= kMaxAnswerBytes) return whole;
  v1::TransferStatus brief = status;
  *brief.mutable_spec() = v1::WithoutBlockTables(status.spec());
  std::string answer = absl::StrCat(kCancelledBrief, brief.SerializeAsString());
  if (answer.size() <= kMaxAnswerBytes) return answer;
  brief.clear_spec();
  answer = absl::StrCat(kCancelledBrief, brief.SerializeAsString());
  if (answer.size() <= kMaxAnswerBytes) return answer;
  // Only a message longer than a packet is left: its start is kept (Get has it whole).
  brief.mutable_error_message()->resize(kMaxAnswerBytes / 2);
  return absl::StrCat(kCancelledBrief, brief.SerializeAsString());
}

absl::StatusOr<v1::TransferStatus> ParseCancelAnswer(absl::string_view packet, bool* brief) {
  absl::string_view body = packet;
  const bool is_brief = absl::ConsumePrefix(&body, kCancelledBrief);
  if (is_brief || absl::ConsumePrefix(&body, kCancelled)) {
    v1::TransferStatus status;
    if (!status.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
      return absl::InternalError("session socket: the CANCELLED answer does not parse");
    }
    if (brief != nullptr) *brief = is_brief;
    return status;
  }
  if (std::optional<absl::Status> rejected = ParseRejected(packet)) return *rejected;
  return absl::UnimplementedError(
      absl::StrCat("session socket: no CANCEL here (\"", packet.substr(0, 80), "\")"));
}

// --- Sending and receiving -----------------------------------------------------------------------

absl::Status SendPacket(int sock, absl::string_view payload, int fd, int flags) {
  return SendPacketFds(sock, payload, &fd, fd >= 0 ? 1 : 0, flags);
}

absl::Status SendPacketFds(int sock, absl::string_view payload, const int* fds, size_t count,
                           int flags) {
  if (count > kMaxFdsPerPacket) {
    return absl::InvalidArgumentError(absl::StrCat("fds: ", count, " exceed ", kMaxFdsPerPacket));
  }
  struct iovec iov;
  iov.iov_base = const_cast<char*>(payload.data());
  iov.iov_len = payload.size();
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerPacket)];
  if (count > 0) {
    memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * count);
    struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * count);
    memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * count);
  }
  while (true) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
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

ReceiveBuffer::ReceiveBuffer(size_t max_payload_bytes)
    : payload_(max_payload_bytes), control_(CMSG_SPACE(sizeof(int) * kMaxFdsPerPacket)) {}

absl::StatusOr<Received> ReceiveMessage(int sock, ReceiveBuffer* buffer, int flags) {
  struct iovec iov;
  iov.iov_base = buffer->payload();
  iov.iov_len = buffer->max_payload_bytes();
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = buffer->control();
  msg.msg_controllen = buffer->control_size();
  ssize_t n;
  while (true) {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    // Nothing was received: the control buffer holds whatever it held before (on a failed
    // recvmsg the kernel leaves msg_controllen as we set it), so it is not looked at.
    return ErrnoStatus("recvmsg", errno);
  }
  Received received;
  // msg_controllen is now what the kernel wrote (0 when nothing came).
  if (msg.msg_controllen > 0) TakeDescriptors(&msg, &received.fds);
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    const size_t arrived = received.fds.size();
    received.fds.clear();  // closes them: the packet fails as a whole
    return absl::ResourceExhaustedError(
        absl::StrCat("ancillary data truncated: more than ", kMaxFdsPerPacket,
                     " descriptors in one packet (", arrived, " arrived and were closed)"));
  }
  received.truncated = (msg.msg_flags & MSG_TRUNC) != 0;
  if (n == 0 && !received.truncated && received.fds.empty()) {
    // A zero-length read on SEQPACKET means the peer closed the connection.
    return absl::UnavailableError("connection closed by peer");
  }
  received.payload = absl::string_view(buffer->payload(), static_cast<size_t>(n));
  return received;
}

absl::StatusOr<std::string> ReceivePacket(int sock, UniqueFd* fd) {
  ReceiveBuffer buffer(kMaxAnswerBytes);
  if (fd != nullptr) *fd = UniqueFd();
  absl::StatusOr<Received> received = ReceiveMessage(sock, &buffer);
  if (!received.ok()) return received.status();
  if (received->truncated) {
    return absl::InternalError(absl::StrCat("packet longer than ", kMaxAnswerBytes, " bytes"));
  }
  if (fd != nullptr && !received->fds.empty()) *fd = std::move(received->fds.front());
  return std::string(received->payload);  // the other descriptors close here
}

}  // namespace kvrail::wire
