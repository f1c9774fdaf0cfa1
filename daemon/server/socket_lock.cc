#include "daemon/server/socket_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/unique_fd.h"

namespace kvrail::server {
namespace {

absl::Status Unavailable(absl::string_view what, const std::string& path, int err) {
  return absl::UnavailableError(
      absl::StrCat("unix_socket: ", what, " lock file ", path, ": ", strerror(err)));
}

// The pid the holder wrote, as text ("unknown" while it has not written it yet).
std::string HolderPid(int fd) {
  char text[32] = {};
  const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
  const absl::string_view pid =
      n > 0 ? absl::StripAsciiWhitespace(absl::string_view(text, static_cast<size_t>(n))) : "";
  return pid.empty() ? "unknown" : std::string(pid);
}

// Thread contract: none needed; immutable after Acquire.
class SocketLockImpl final : public SocketLock {
 public:
  SocketLockImpl(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  const std::string& path() const override { return path_; }
  int fd() const override { return fd_.get(); }

 private:
  const UniqueFd fd_;  // the open file description that holds the flock
  const std::string path_;
};

}  // namespace

std::string SocketLockPath(const std::string& unix_socket) { return unix_socket + ".lock"; }

absl::StatusOr<std::unique_ptr<SocketLock>> SocketLock::Acquire(const std::string& unix_socket) {
  const std::string path = SocketLockPath(unix_socket);
  // CLOEXEC: a child the daemon starts must not keep the lock after the daemon exits.
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return Unavailable("cannot open", path, errno);
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return Unavailable("cannot lock", path, errno);
    return absl::FailedPreconditionError(absl::StrCat(
        "unix_socket: ", unix_socket, " is served by another kvraild (pid ", HolderPid(fd.get()),
        ", holding ", path, "); stop it first or choose another --socket"));
  }
  return Own(std::move(fd), path);
}

absl::StatusOr<std::unique_ptr<SocketLock>> SocketLock::Adopt(UniqueFd fd,
                                                              const std::string& unix_socket) {
  const std::string path = SocketLockPath(unix_socket);
  struct stat handed {
  }, at_path{};
  if (!fd.valid() || ::fstat(fd.get(), &handed) != 0 || ::stat(path.c_str(), &at_path) != 0 ||
      handed.st_dev != at_path.st_dev || handed.st_ino != at_path.st_ino) {
    return absl::FailedPreconditionError(
        absl::StrCat("handover: the lock descriptor handed over is not ", path,
                     " (the predecessor serves ", "another socket?)"));
  }
  // Succeeds only on the open file that holds the lock (any other would find it taken).
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    return absl::FailedPreconditionError(
        absl::StrCat("handover: the descriptor handed over does not hold the lock on ", path, ": ",
                     strerror(errno)));
  }
  return Own(std::move(fd), path);
}

absl::StatusOr<std::unique_ptr<SocketLock>> SocketLock::Own(UniqueFd fd, const std::string& path) {
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return Unavailable("cannot write", path, errno);
  }
  return std::unique_ptr<SocketLock>(new SocketLockImpl(std::move(fd), path));
}

}  // namespace kvrail::server
