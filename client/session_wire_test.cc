// The session socket's wire against a fake daemon: a SOCK_SEQPACKET server in a thread, inside a
// temporary directory, speaking the protocol of client/session_wire.h.
#define CATCH_CONFIG_MAIN
#include "client/session_wire.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "client/kvrail_client.h"

namespace kvrail::client {
namespace {

using internal::ReceivePacket;
using internal::SendPacket;
using internal::SessionConnection;
using internal::UniqueFd;

// A temporary directory removed (with the files the test put there) on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvrail_session_test.XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    ::unlink((path_ + "/k.sock.session").c_str());
    ::rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Listens on `path`, accepts one connection and runs `serve` on it in a thread.
class FakeDaemon {
 public:
  FakeDaemon(const std::string& path, std::function<void(int)> serve) {
    listener_ = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    REQUIRE(listener_.valid());
    struct sockaddr_un addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    REQUIRE(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(listener_.get(), 4) == 0);
    thread_ = std::thread([this, serve = std::move(serve)] {
      UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn.valid()) return;
      serve(conn.get());
    });
  }
  ~FakeDaemon() { thread_.join(); }

 private:
  UniqueFd listener_;
  std::thread thread_;
};

TEST_CASE("the fd passed over the session socket maps the same memfd") {
  TempDir dir;
  const std::string path = internal::SessionSocketPath(dir.path() + "/k.sock");
  CHECK(path == dir.path() + "/k.sock.session");

  auto buffer = HostBuffer::Create(1 << 20);
  REQUIRE(buffer.ok());
  HostBuffer& host = **buffer;
  for (size_t i = 0; i < host.size(); ++i) host.data()[i] = static_cast<uint8_t>(i * 7 + 3);

  std::atomic<bool> server_saw_pattern{false};
  std::atomic<bool> server_wrote{false};
  std::string server_error;
  {
    FakeDaemon daemon(path, [&](int conn) {
      if (!SendPacket(conn, "SESSION 42").ok()) return;
      for (int round = 0; round < 2; ++round) {
        UniqueFd fd;
        auto packet = ReceivePacket(conn, &fd);
        if (!packet.ok() || *packet != "FD" || !fd.valid()) {
          server_error = "bad FD packet";
          (void)SendPacket(conn, "ERROR bad FD packet");
          return;
        }
        struct stat st;
        ::fstat(fd.get(), &st);
        const size_t size = static_cast<size_t>(st.st_size);
        void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
        if (map == MAP_FAILED) {
          server_error = "mmap failed";
          (void)SendPacket(conn, "ERROR mmap failed");
          return;
        }
        auto* bytes = static_cast<uint8_t*>(map);
        bool same = size == (1u << 20);
        for (size_t i = 0; same && i < size; ++i)
          same = bytes[i] == static_cast<uint8_t>(i * 7 + 3);
        server_saw_pattern = same;
        // Write through the daemon's mapping; the client must see it through its own.
        std::memset(bytes + 4096, 0x5A, 4096);
        server_wrote = true;
        ::munmap(map, size);
        (void)SendPacket(conn, round == 0 ? "TOKEN tok-1" : "ERROR too many regions");
      }
      // Wait for the client to close; a closed connection reads as UNAVAILABLE.
      auto eof = ReceivePacket(conn);
      if (eof.ok() || eof.status().code() != absl::StatusCode::kUnavailable) {
        server_error = "expected the client to close";
      }
    });

    {
      auto session = SessionConnection::Open(path);
      REQUIRE(session.ok());
      CHECK((*session)->session_id() == 42);
      auto token = (*session)->SendFd(host.fd());
      REQUIRE(token.ok());
      CHECK(*token == "tok-1");
      CHECK(server_saw_pattern);
      CHECK(server_wrote);
      for (size_t i = 4096; i < 8192; ++i) REQUIRE(host.data()[i] == 0x5A);
      CHECK(host.data()[4095] == static_cast<uint8_t>(4095 * 7 + 3));

      auto refused = (*session)->SendFd(host.fd());
      REQUIRE_FALSE(refused.ok());
      CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
      CHECK_THAT(std::string(refused.status().message()), Catch::Contains("too many regions"));
    }  // closes the session
  }    // FakeDaemon joins its thread
  CHECK(server_error.empty());
}

TEST_CASE("a bad greeting or a vanished daemon is a clear error") {
  TempDir dir;
  const std::string path = dir.path() + "/k.sock.session";
  SECTION("no socket") {
    auto session = SessionConnection::Open(path);
    REQUIRE_FALSE(session.ok());
    CHECK(session.status().code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(session.status().message()), Catch::Contains(path));
  }
  SECTION("wrong greeting") {
    FakeDaemon daemon(path, [](int conn) { (void)SendPacket(conn, "HELLO 1"); });
    auto session = SessionConnection::Open(path);
    REQUIRE_FALSE(session.ok());
    CHECK_THAT(std::string(session.status().message()), Catch::Contains("HELLO 1"));
  }
  SECTION("daemon closes instead of answering FD") {
    FakeDaemon daemon(path, [](int conn) {
      (void)SendPacket(conn, "SESSION 7\n");  // a trailing newline is tolerated
      UniqueFd fd;
      (void)ReceivePacket(conn, &fd);
    });
    auto session = SessionConnection::Open(path);
    REQUIRE(session.ok());
    CHECK((*session)->session_id() == 7);
    UniqueFd memfd(::memfd_create("t", MFD_CLOEXEC));
    auto token = (*session)->SendFd(memfd.get());
    REQUIRE_FALSE(token.ok());
    CHECK(token.status().code() == absl::StatusCode::kUnavailable);
  }
  SECTION("daemon never answers: the receive timeout fires") {
    std::atomic<bool> done{false};
    FakeDaemon daemon(path, [&](int conn) {
      while (!done) ::usleep(1000);
      (void)conn;
    });
    auto session = SessionConnection::Open(path, absl::Milliseconds(100));
    done = true;
    REQUIRE_FALSE(session.ok());
    CHECK(session.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
}

}  // namespace
}  // namespace kvrail::client
