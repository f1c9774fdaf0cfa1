// Unix sockets that appear with their final permissions. A socket bound at its path gets the
// process umask's permission bits until it is chmod'ed, a window in which any user on the node
// could connect. Instead the socket is bound inside a fresh 0700 directory beside
// its path, chmod'ed there, and renamed over the path: at the path it has its mode from the
// first moment, or does not exist.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvrail::server {

// Owns the private directory; the destructor removes it (and whatever is still bound inside).
// Not thread-safe; used once at start.
class PrivateBind {
 public:
  // Makes "<directory of path>/.kvrail-XXXXXX" (0700). INVALID_ARGUMENT naming unix_socket when
  // the temporary socket path would not fit a sockaddr_un; UNAVAILABLE when the directory
  // cannot be made.
  static absl::StatusOr<std::unique_ptr<PrivateBind>> Create(const std::string& path);
  virtual ~PrivateBind() = default;

  // Where to bind the socket (inside the private directory).
  virtual const std::string& bind_path() const = 0;
  // Gives the bound socket `mode`, then renames it to the final path (replacing a file there).
  // INTERNAL naming the step that failed.
  virtual absl::Status Publish(uint32_t mode) = 0;
};

}  // namespace kvrail::server
