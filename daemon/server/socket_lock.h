// One kvraild per socket: an exclusive flock on "<unix_socket>.lock" (holding the owner's pid),
// taken before the daemon unlinks or binds anything at that path. A second daemon on the same
// socket is refused instead of replacing the first one's sockets (and deleting them on its exit,
// which left the first running but unreachable).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"

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

  // Takes over the lock of a predecessor in a hot restart: `fd` is a duplicate of its
  // descriptor (fd()), so both hold the one open file that holds the flock, and the lock stays
  // held while either process lives. Writes this process's pid into the file. FAILED_PRECONDITION
  // when `fd` is not the lock file of `unix_socket` or does not hold its lock.
  static absl::StatusOr<std::unique_ptr<SocketLock>> Adopt(UniqueFd fd,
                                                           const std::string& unix_socket);

  virtual const std::string& path() const = 0;
  // The descriptor that holds the lock (its duplicate goes to a successor).
  virtual int fd() const = 0;

 private:
  // Writes this process's pid into the locked file and wraps `fd`.
  static absl::StatusOr<std::unique_ptr<SocketLock>> Own(UniqueFd fd, const std::string& path);
};

// The lock file that belongs to a unix socket path.
std::string SocketLockPath(const std::string& unix_socket);

}  // namespace kvrail::server
