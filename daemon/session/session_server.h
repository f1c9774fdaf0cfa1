// The session socket: gRPC cannot carry file descriptors, so clients pass memfds here.
//
// Wire protocol (SOCK_SEQPACKET unix socket, one message per packet):
//   daemon -> client on accept:  "SESSION <decimal id>"
//   client -> daemon:            "FD" with exactly one descriptor in SCM_RIGHTS
//   daemon -> client:            "TOKEN <token>" or "ERROR <message>"
// A token is single-use and belongs to its session (RegisterRegion.session_id). When the client
// closes the connection, or dies, the session ends and its regions are unregistered.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/regions/regions.h"

namespace kvrail::session {

// Owns the listening socket and one poll thread. Thread-safe to destroy from any thread (stops
// the poll thread, closes every session, which ends them in the region table).
class SessionServer {
 public:
  virtual ~SessionServer() = default;

  // Binds `path` (an existing socket file there is replaced) with permission bits `mode`.
  static absl::StatusOr<std::unique_ptr<SessionServer>> Start(const std::string& path,
                                                              uint32_t mode,
                                                              regions::RegionTable* regions);
  virtual size_t active_sessions() const = 0;
};

}  // namespace kvrail::session
