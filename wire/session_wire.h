// kvraild's session socket, both ends: a SOCK_SEQPACKET unix socket at "<unix_socket>.session"
// that carries memfds to the daemon (gRPC cannot pass file descriptors) and, for transfers within
// the node, submits and waits in one round trip. The client library (client/) and the daemon's
// session server (daemon/session/) both speak it through this module only.
//
// Protocol (one packet per message, text then an optional serialized proto):
//   daemon -> client, on accept:   "SESSION <decimal id>" NUL "INSTANCE <32 hex digits>"
//                                  (the daemon's instance, Stats.instance_id; after a NUL so a
//                                  client that predates it reads "SESSION <id>" and stops there),
//                                  or "REJECTED <code> <message>" and the connection closes
//                                  (a cap: max_sessions, max_sessions_per_uid, descriptors)
//   client -> daemon:              "FD" with exactly one fd in SCM_RIGHTS ancillary data
//   daemon -> client:              "TOKEN <token>" or "ERROR <message>"
//   client -> daemon:              "SUBMIT " + serialized SubmitTransferRequest
//   daemon -> client:              "SUBMITTED " + serialized SubmitTransferResponse, or
//                                  "REJECTED <absl status code> <message>"
//   client -> daemon:              "POST " + serialized PostTransferRequest (a prepared transfer's
//                                  post, Transfer.PostTransfer); answered as SUBMIT
//   client -> daemon:              "WAIT <decimal transfer id>" [" <session id>.<secret>"]
//   daemon -> client:              "DONE " + serialized final TransferStatus, or "REJECTED ..."
//   client -> daemon:              "CANCEL <decimal transfer id>" (as the connection's session)
//   daemon -> client:              "CANCELLED " + serialized TransferStatus (CancelTransfer's
//                                  answer), "CANCELLED_BRIEF " + the same without the spec's
//                                  block ids when the whole status would not fit an answer
//                                  (kMaxAnswerBytes), or "REJECTED ..."
//   client -> daemon:              "CQ" with two fds in SCM_RIGHTS: a completion queue's memfd
//                                  and its eventfd (wire/shm_ring.h); the daemon posts the final
//                                  state of each transfer this connection SUBMITs there
//   daemon -> client:              "CQ OK", or "REJECTED <code> <message>" (the old path stays)
//   client -> daemon:              "SQ" with four fds in SCM_RIGHTS: a submission queue's ring
//                                  memfd and eventfd, then its acknowledgement ring's memfd and
//                                  eventfd (wire/submission_queue.h); the daemon reads transfer
//                                  requests from the first and answers each in the second
//   daemon -> client:              "SQ OK", or "REJECTED <code> <message>" (SUBMIT packets stay)
//   daemon -> client:              "ERROR <message>" for a packet it could not read (e.g. one
//                                  carrying more than kMaxFdsPerPacket descriptors)
// A token is single-use and belongs to the session; RegisterRegion(spec.share.fd_token = token,
// session_id = id) consumes it. When the connection closes the daemon unregisters every region
// registered with the session id, so a client keeps the connection open for its lifetime.
// The connection closing unasked (the daemon died or stopped), or a new connection greeting with
// another instance, is how a client learns that its session and regions are gone.
//
// Free functions here are stateless and thread-safe; SessionConnection states its own contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::wire {

// --- Limits ------------------------------------------------------------------------------------

// The daemon reads requests of up to this many bytes. SUBMIT requests carry block tables of up to
// 8191 ids per side in the message (larger ones go through shared memory), so 256 KiB is ample.
inline constexpr size_t kMaxRequestBytes = 256 << 10;
// The client reads answers of up to this many bytes (ASCII lines or a serialized status).
inline constexpr size_t kMaxAnswerBytes = 16384;
// The client submits requests up to this size over the session, larger ones over gRPC (a
// SEQPACKET packet must fit the socket buffer).
inline constexpr size_t kMaxSessionSubmitBytes = 128 << 10;
// Room for this many descriptors in one receive: a peer sending more cannot leak them into us
// unnoticed (the packet fails and those that arrived are closed).
inline constexpr size_t kMaxFdsPerPacket = 8;

// The session socket path that belongs to a gRPC unix socket path.
std::string SessionSocketPath(const std::string& grpc_socket_path);

// --- Packets -----------------------------------------------------------------------------------

// Daemon -> client.
// "SESSION <id>", then NUL "INSTANCE <instance_id>" when `instance_id` is not empty, then NUL
// "SECRET <secret>" when `secret` is not empty (the session's credential for gRPC calls: sent
// only on this connection; kvrail_client.h attaches it as `kvrail-session` metadata).
std::string EncodeGreeting(uint64_t session_id, absl::string_view instance_id = "",
                           absl::string_view secret = "");
std::string EncodeToken(absl::string_view token);    // "TOKEN <token>"
std::string EncodeError(absl::string_view message);  // "ERROR <message>"
std::string EncodeSubmitted(const v1::SubmitTransferResponse& response);
std::string EncodeDone(const v1::TransferStatus& status);
// "REJECTED <code number> <message>"; `status` must not be OK.
std::string EncodeRejected(const absl::Status& status);

// Client -> daemon.
inline constexpr char kFdRequest[] = "FD";
inline constexpr char kCompletionQueueRequest[] = "CQ";
inline constexpr char kCompletionQueueAccepted[] = "CQ OK";
inline constexpr char kSubmissionQueueRequest[] = "SQ";
inline constexpr char kSubmissionQueueAccepted[] = "SQ OK";
std::string EncodeSubmit(const v1::SubmitTransferRequest& request);
std::string EncodePost(const v1::PostTransferRequest& request);
// "WAIT <id>", or "WAIT <id> <credential>": the credential (SessionMetadataValue) names the
// session that waits when it is not the connection's own (the client waits on spare
// connections, as its main session: only a transfer's submitter may wait for it).
std::string EncodeWait(uint64_t transfer_id, absl::string_view credential = "");
// "CANCEL <id>": cancelled as the connection's session (no credential: a spare connection's
// session owns nothing, so only the main session's connection cancels its transfers).
std::string EncodeCancel(uint64_t transfer_id);

// What a request packet asks for; `body` is what follows "SUBMIT " / "WAIT " (a view into the
// packet). kOther: anything else, including "FD" with trailing bytes.
enum class RequestKind {
  kFd,
  kSubmit,
  kPost,
  kWait,
  kCancel,
  kCompletionQueue,
  kSubmissionQueue,
  kOther
};
struct Request {
  RequestKind kind = RequestKind::kOther;
  absl::string_view body;
};
Request ParseRequest(absl::string_view packet);
// A SUBMIT body; INVALID_ARGUMENT "SUBMIT: not a serialized SubmitTransferRequest" otherwise.
absl::StatusOr<v1::SubmitTransferRequest> ParseSubmitBody(absl::string_view body);
// A POST body; INVALID_ARGUMENT "POST: not a serialized PostTransferRequest" otherwise.
absl::StatusOr<v1::PostTransferRequest> ParsePostBody(absl::string_view body);
// A WAIT body (decimal digits). INVALID_ARGUMENT quoting the packet when it is not one, or when
// `plain` is false (the packet carried descriptors or was truncated).
absl::StatusOr<uint64_t> ParseWaitBody(absl::string_view body, bool plain);
// The (session id, secret) a WAIT body's credential names; nullopt when it has none or it is
// malformed (the daemon then refuses the WAIT if there was one: UNAUTHENTICATED).
std::optional<std::pair<uint64_t, std::string>> ParseWaitCredential(absl::string_view body);
// A CANCEL body (decimal digits, nothing else). INVALID_ARGUMENT quoting the packet when it is
// not one, or when `plain` is false.
absl::StatusOr<uint64_t> ParseCancelBody(absl::string_view body, bool plain);

// The daemon's greeting: the session id (never 0). A trailing newline or NUL is tolerated.
// A "REJECTED ..." packet instead (the daemon refused the session: a cap, RESOURCE_EXHAUSTED
// naming it) is the status it names; anything else INTERNAL quoting the packet.
absl::StatusOr<uint64_t> ParseGreeting(absl::string_view packet);
// The daemon instance a greeting names (what follows NUL "INSTANCE "), or "" when it names none
// (an older daemon) or the part is malformed.
std::string ParseGreetingInstance(absl::string_view packet);
// The session secret a greeting carries (what follows NUL "SECRET "), or "" when none.
std::string ParseGreetingSecret(absl::string_view packet);
// The gRPC metadata key and value that bind a call to a session.
inline constexpr char kSessionMetadataKey[] = "kvrail-session";
std::string SessionMetadataValue(uint64_t session_id, absl::string_view secret);
// (session id, secret) from a metadata value; nullopt when it is not "<id>.<secret>".
std::optional<std::pair<uint64_t, std::string>> ParseSessionMetadata(absl::string_view value);
// The answer to FD: the token; FAILED_PRECONDITION with the daemon's message for "ERROR ...";
// INTERNAL quoting the packet for anything else. Trailing whitespace or NUL is tolerated.
absl::StatusOr<std::string> ParseTokenAnswer(absl::string_view packet);
// "REJECTED <code> <message>" as the status it names; nullopt for any other packet (or a code
// that is not a non-OK absl code).
std::optional<absl::Status> ParseRejected(absl::string_view packet);
// The answer to SUBMIT: the response, or the status it was rejected with. An unparsable
// SUBMITTED body is INTERNAL; anything else (an older daemon's "ERROR ...") is UNIMPLEMENTED.
absl::StatusOr<v1::SubmitTransferResponse> ParseSubmitAnswer(absl::string_view packet);
// The answer to WAIT, in the same shape: the final status, the REJECTED status, INTERNAL for an
// unparsable DONE body, UNIMPLEMENTED for anything else.
absl::StatusOr<v1::TransferStatus> ParseDoneAnswer(absl::string_view packet);
// The answer to CANCEL for `status` (the daemon's side): "CANCELLED " + the status when it fits
// kMaxAnswerBytes, else "CANCELLED_BRIEF " + the status with its spec's block ids and tables
// cleared (should that still not fit: without its spec, then with the start of its error
// message only).
std::string EncodeCancelled(const v1::TransferStatus& status);
// The answer to CANCEL: the status; `brief` (when not null) set when the daemon left the spec's
// block ids out (Get has them). The REJECTED status; INTERNAL for an unparsable body;
// UNIMPLEMENTED for anything else (an older daemon's "ERROR ...").
absl::StatusOr<v1::TransferStatus> ParseCancelAnswer(absl::string_view packet, bool* brief);

// --- Sending and receiving ---------------------------------------------------------------------

// Sends one packet, with `fd` (still owned by the caller) in SCM_RIGHTS when fd >= 0. `flags`
// are added to MSG_NOSIGNAL (the daemon passes MSG_DONTWAIT). EAGAIN (a send timeout, or a full
// buffer with MSG_DONTWAIT) is DEADLINE_EXCEEDED, other failures UNAVAILABLE.
absl::Status SendPacket(int sock, absl::string_view payload, int fd = -1, int flags = 0);
// The same with `count` descriptors (at most kMaxFdsPerPacket) in one SCM_RIGHTS message.
absl::Status SendPacketFds(int sock, absl::string_view payload, const int* fds, size_t count,
                           int flags = 0);

// The memory one receive uses: the payload (a longer packet is truncated) and the ancillary data
// (room for kMaxFdsPerPacket descriptors). Reused by a caller that receives often. Not
// thread-safe: one receive at a time.
class ReceiveBuffer {
 public:
  explicit ReceiveBuffer(size_t max_payload_bytes);
  ReceiveBuffer(const ReceiveBuffer&) = delete;
  ReceiveBuffer& operator=(const ReceiveBuffer&) = delete;

  char* payload() { return payload_.data(); }
  size_t max_payload_bytes() const { return payload_.size(); }
  // The control buffer handed to recvmsg. Its prior contents are never read: only what the
  // kernel reports having written (exposed so tests can pre-fill it and check exactly that).
  char* control() { return control_.data(); }
  size_t control_size() const { return control_.size(); }

 private:
  std::vector<char> payload_;
  std::vector<char> control_;
};

struct Received {
  absl::string_view payload;  // into the ReceiveBuffer; valid until its next receive
  std::vector<UniqueFd> fds;  // every descriptor that came (close-on-exec), in order
  bool truncated = false;     // the packet was longer than max_payload_bytes
};

// Receives one packet into `buffer`. `flags` are added to MSG_CMSG_CLOEXEC (the daemon passes
// MSG_DONTWAIT); EINTR is retried. Errors:
//   DEADLINE_EXCEEDED  nothing to read (EAGAIN: the socket's receive timeout or MSG_DONTWAIT);
//   UNAVAILABLE        the peer closed the connection (an empty packet without descriptors), or
//                      recvmsg failed (ECONNRESET, ENOTSOCK, ...);
//   RESOURCE_EXHAUSTED the descriptors did not fit (MSG_CTRUNC): those that arrived are closed.
// Ancillary data is parsed only after a successful recvmsg, and only as far as msg_controllen.
absl::StatusOr<Received> ReceiveMessage(int sock, ReceiveBuffer* buffer, int flags = 0);

// Receives one answer-sized packet (kMaxAnswerBytes; a longer one is INTERNAL). When `fd` is
// non-null it receives the first passed descriptor (or stays invalid when none came); any others
// are closed. A closed connection is UNAVAILABLE; a receive timeout DEADLINE_EXCEEDED.
absl::StatusOr<std::string> ReceivePacket(int sock, UniqueFd* fd = nullptr);

// --- The client's end -------------------------------------------------------------------------

// One connection to the session socket. Thread contract: SendFd, Exchange and SetAnswerTimeout
// may be called from any thread; exchanges are serialised internally (each request waits for its
// own answer before the next one is sent, so answers can never be mismatched).
class SessionConnection {
 public:
  // Connects to `session_socket_path` and reads the daemon's "SESSION <id>" greeting. Answers
  // that take longer than `timeout` fail with DEADLINE_EXCEEDED.
  static absl::StatusOr<std::unique_ptr<SessionConnection>> Open(
      const std::string& session_socket_path, absl::Duration timeout = absl::Seconds(5));
  virtual ~SessionConnection() = default;

  virtual uint64_t session_id() const = 0;
  virtual const std::string& path() const = 0;
  // The daemon instance the greeting named ("" from an older daemon).
  virtual const std::string& instance_id() const = 0;
  // The session's secret from the greeting ("" from an older daemon).
  virtual const std::string& secret() const = 0;

  // Whether the daemon has closed the connection (it stopped or died), checked without waiting
  // and without reading anything.
  virtual bool PeerClosed() const = 0;
  // Blocks until the daemon closes the connection (true) or `wake_fd` becomes readable (false).
  // Reads nothing from either; may run beside exchanges on other threads (a monitor thread).
  // INTERNAL when poll fails.
  virtual absl::StatusOr<bool> WaitForClose(int wake_fd) const = 0;

  // Passes `fd` (which stays owned by the caller) to the daemon and returns the token it answered.
  // An "ERROR <message>" answer becomes FAILED_PRECONDITION with the daemon's message.
  virtual absl::StatusOr<std::string> SendFd(int fd) = 0;

  // Sends `packet` and returns the daemon's answer (one exchange at a time, as SendFd). `*sent`
  // tells whether the packet left: a failure after that may have been acted on by the daemon.
  virtual absl::StatusOr<std::string> Exchange(const std::string& packet, bool* sent) = 0;

  // Passes a completion queue's memfd and eventfd (still owned by the caller; wire/shm_ring.h)
  // to the daemon. OK when it took them; the REJECTED status, or UNIMPLEMENTED from a daemon
  // that does not know "CQ" (the caller then keeps the packet path).
  virtual absl::Status SendCompletionQueue(int memfd, int eventfd) = 0;
  // Passes a submission queue's four descriptors (still owned by the caller;
  // wire/submission_queue.h) to the daemon, with the same answers as SendCompletionQueue.
  virtual absl::Status SendSubmissionQueue(int sq_memfd, int sq_eventfd, int ack_memfd,
                                           int ack_eventfd) = 0;

  // How long answers may take from now on (InfiniteDuration: no limit; a closed connection still
  // ends a wait with UNAVAILABLE).
  virtual void SetAnswerTimeout(absl::Duration timeout) = 0;
  // Before it sleeps in the receive, an exchange polls for its answer without sleeping for up to
  // `spin` (a thread wake-up costs tens of microseconds on the critical path). Zero (the
  // default): it sleeps at once.
  virtual void SetAnswerSpin(absl::Duration spin) = 0;
  // How many polls exchanges have made for their answer while spinning (none without a spin), so
  // that tests see whether the spin ran.
  virtual uint64_t answer_spin_polls() const = 0;
};

}  // namespace kvrail::wire
