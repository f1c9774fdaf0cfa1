#include "base/logging_systemd.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

namespace kvrail {
namespace {

// A datagram socket standing in for systemd's notify socket.
struct FakeSystemd {
  int fd = -1;
  std::string path;
  FakeSystemd() {
    char dir[] = "/tmp/kvrail-notify-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    path = std::string(dir) + "/notify";
    fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  }
  ~FakeSystemd() {
    ::unsetenv("NOTIFY_SOCKET");
    ::close(fd);
    ::unlink(path.c_str());
    ::rmdir(path.substr(0, path.rfind('/')).c_str());
  }
  std::string Receive() const {
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
};

TEST_CASE(
    "sd_notify: READY (with MAINPID), STATUS and STOPPING reach the notify socket, one line each") {
  FakeSystemd systemd;
  CHECK(NotifyReady("serving: 0 regions"));
  // MAINPID: a hot restart's successor makes itself the unit's main process this way.
  CHECK(systemd.Receive() ==
        "READY=1\nMAINPID=" + std::to_string(::getpid()) + "\nSTATUS=serving: 0 regions");
  CHECK(NotifyStatus("serving: 2 regions,\n1 active"));
  CHECK(systemd.Receive() == "STATUS=serving: 2 regions, 1 active");
  CHECK(NotifyStopping("draining"));
  CHECK(systemd.Receive() == "STOPPING=1\nSTATUS=draining");
}

TEST_CASE("sd_notify: outside a notify unit nothing is sent and nothing fails") {
  ::unsetenv("NOTIFY_SOCKET");
  CHECK_FALSE(NotifyReady("x"));
  CHECK_FALSE(NotifyStatus("x"));
}

}  // namespace
}  // namespace kvrail
