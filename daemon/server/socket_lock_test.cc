// SocketLock: one holder per socket path; the refusal names the socket and the holder's pid; the
// lock is free again once its holder is gone.
#include "daemon/server/socket_lock.h"

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kvrail::server {
namespace {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string templ = std::string(base != nullptr ? base : "/tmp") + "/lock.XXXXXX";
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("a second holder of the same socket's lock is refused, naming the pid and the socket") {
  TempDir dir;
  const std::string socket = dir.path() + "/kvrail.sock";
  const std::string pid = std::to_string(::getpid());
  {
    auto first = SocketLock::Acquire(socket);
    REQUIRE(first.ok());
    CHECK((*first)->path() == socket + ".lock");
    CHECK(ReadFile(socket + ".lock") == pid + "\n");

    // A second open file description conflicts like another process would.
    auto second = SocketLock::Acquire(socket);
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
    const std::string message(second.status().message());
    CHECK_THAT(message, Catch::Contains("(pid " + pid + ","));
    CHECK_THAT(message, Catch::StartsWith("unix_socket: " + socket + " is served by"));
    CHECK(ReadFile(socket + ".lock") == pid + "\n");  // the refused one wrote nothing

    // Another socket in the same folder is independent.
    CHECK(SocketLock::Acquire(dir.path() + "/other.sock").ok());
  }
  // Released with its holder: the next daemon takes it.
  auto again = SocketLock::Acquire(socket);
  CHECK(again.ok());
}

TEST_CASE("a lock file that cannot be created is UNAVAILABLE naming it") {
  TempDir dir;
  const std::string socket = dir.path() + "/missing/kvrail.sock";
  auto lock = SocketLock::Acquire(socket);
  REQUIRE_FALSE(lock.ok());
  CHECK(lock.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(lock.status().message()), Catch::Contains(socket + ".lock"));
}

}  // namespace
}  // namespace kvrail::server
