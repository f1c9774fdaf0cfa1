// PrivateBind: a socket appears at its path only by rename, already with its mode, whatever the
// umask; the private directory is 0700 and is removed.
#include "daemon/server/private_bind.h"

#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

namespace kvrail::server {
namespace {

int BindUnix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

TEST_CASE("a socket appears at its path by rename with its mode, under a wide-open umask") {
  char tmpl[] = "/tmp/kvrail-private-bind.XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string path = dir + "/kvrail.sock";
  const mode_t old_umask = ::umask(0);
  const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  REQUIRE(watch >= 0);
  REQUIRE(::inotify_add_watch(watch, dir.c_str(), IN_CREATE | IN_MOVED_TO) >= 0);

  auto bind = PrivateBind::Create(path);
  REQUIRE(bind.ok());
  struct stat st {};
  const std::string parent = (*bind)->bind_path().substr(0, (*bind)->bind_path().rfind('/'));
  REQUIRE(::stat(parent.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  const int sock = BindUnix((*bind)->bind_path());
  CHECK(::access(path.c_str(), F_OK) != 0);  // nothing at the path before it has its mode
  REQUIRE((*bind)->Publish(0660).ok());
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0660);

  // The socket's name in `dir` was never created there, only moved in.
  alignas(inotify_event) char events[4096];
  const ssize_t n = ::read(watch, events, sizeof(events));
  REQUIRE(n > 0);
  bool created = false, moved = false;
  for (ssize_t at = 0; at < n;) {
    const auto* e = reinterpret_cast<const inotify_event*>(events + at);
    if (e->len > 0 && std::string(e->name) == "kvrail.sock") {
      created |= (e->mask & IN_CREATE) != 0;
      moved |= (e->mask & IN_MOVED_TO) != 0;
    }
    at += sizeof(inotify_event) + e->len;
  }
  CHECK_FALSE(created);
  CHECK(moved);
  bind->reset();
  CHECK(::access(parent.c_str(), F_OK) != 0);  // the private directory is gone
  ::umask(old_umask);
  ::close(watch);
  ::close(sock);
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("a path whose directory is too long for a socket beside it is refused, naming it") {
  const std::string path = "/" + std::string(100, 'd') + "/kvrail.sock";
  auto bind = PrivateBind::Create(path);
  REQUIRE_FALSE(bind.ok());
  CHECK(bind.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bind.status().message()).find("unix_socket") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::server
