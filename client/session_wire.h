// The client side of kvraild's session socket: a SOCK_SEQPACKET unix socket at
// "<unix_socket>.session" that carries memfds to the daemon (gRPC cannot pass file descriptors).
//
// Protocol (one packet per message):
//   daemon -> client, on accept:   "SESSION <decimal id>"
//   client -> daemon:              "FD" with exactly one fd in SCM_RIGHTS ancillary data
//   daemon -> client:              "TOKEN <token>" or "ERROR <message>"
//   client -> daemon:              "SUBMIT " + serialized SubmitTransferRequest
//   daemon -> client:              "SUBMITTED " + serialized SubmitTransferResponse, or
//                                  "REJECTED <absl status code> <message>"
//   client -> daemon:              "WAIT <transfer id>"
//   daemon -> client:              "DONE " + serialized final TransferStatus, or "REJECTED ..."
//   (daemon/session/session_server.h has the daemon's side.)
// A token is single-use and belongs to the session; RegisterRegion(spec.share.fd_token = token,
// session_id = id) consumes it. When the connection closes the daemon unregisters every region
// registered with the session id, so a client keeps the connection open for its lifetime.
//
// Internal to //client (the public header is kvrail_client.h); the packet helpers are exposed so
// tests can play the daemon's side.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"

namespace kvrail::client::internal {

// The session socket path that belongs to a gRPC unix socket path.
std::string SessionSocketPath(const std::string& grpc_socket_path);

using ::kvrail::UniqueFd;  // base/unique_fd.h: the project's one fd owner

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

  // Passes `fd` (which stays owned by the caller) to the daemon and returns the token it answered.
  // An "ERROR <message>" answer becomes FAILED_PRECONDITION with the daemon's message.
  virtual absl::StatusOr<std::string> SendFd(int fd) = 0;

  // Sends `packet` and returns the daemon's answer (one exchange at a time, as SendFd). `*sent`
  // tells whether the packet left: a failure after that may have been acted on by the daemon.
  virtual absl::StatusOr<std::string> Exchange(const std::string& packet, bool* sent) = 0;

  // How long answers may take from now on (InfiniteDuration: no limit; a closed connection still
  // ends a wait with UNAVAILABLE).
  virtual void SetAnswerTimeout(absl::Duration timeout) = 0;
};

// Packet helpers (blocking; the socket's SO_RCVTIMEO bounds reads).
// Sends one packet, with `fd` in SCM_RIGHTS when fd >= 0.
absl::Status SendPacket(int sock, const std::string& payload, int fd = -1);
// Receives one packet. When `fd` is non-null it receives a passed descriptor (or stays invalid
// when none came); descriptors are always received with MSG_CMSG_CLOEXEC and any extra ones are
// closed. A closed connection is UNAVAILABLE.
absl::StatusOr<std::string> ReceivePacket(int sock, UniqueFd* fd = nullptr);

}  // namespace kvrail::client::internal
