// One kvraild per socket: an exclusive flock on "<unix_socket>.lock" (holding the owner's pid),
// taken before the daemon unlinks or binds anything at that path. A second daemon on the same
// socket is refused instead of replacing the first one's sockets (and deleting them on its exit,
// which left the first running but unreachable).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvrail::server {

// Holds the lock while it lives; the kernel drops it when the process ends however it ends, so
// a crashed daemon never blocks the next one. The lock file itself stays (removing it would let
// a daemon lock a fresh inode while another still holds the old one). Not thread-safe; the
// daemon holds one for its whole run.
class SocketLock {
 public:
  virtual ~SocketLock() = default;

  // Locks `unix_socket` + ".lock" (created 0644 when missing) and writes this process's pid into
  // it. FAILED_PRECONDITION naming the socket and the pid found in the file when another process
  // holds the lock; UNAVAILABLE when the lock file cannot be opened or written.
  static absl::StatusOr<std::unique_ptr<SocketLock>> Acquire(const std::string& unix_socket);

  virtual const std::string& path() const = 0;
};

// The lock file that belongs to a unix socket path.
std::string SocketLockPath(const std::string& unix_socket);

}  // namespace kvrail::server
