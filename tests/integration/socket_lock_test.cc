// Two kvraild on one socket: the second is refused (exit code non-zero, naming the first one's
// pid and the socket) before it touches anything, and the first keeps serving both its gRPC
// socket and its session socket after the second has gone.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <string>

#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

bool IsSocket(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

TEST_CASE("a second kvraild on the same socket is refused and the first keeps serving") {
  LiveDaemon live;
  const std::string socket = live.daemon.socket();
  const std::string pid = std::to_string(live.daemon.pid());

  // `timeout`: a second daemon that wrongly started serves until it is stopped; stopping it
  // then shows the damage it does on exit (it removed the first one's sockets).
  const CommandResult second =
      RunCommand({"/usr/bin/timeout", "10", RunfilePath("daemon/kvraild"), "--socket", socket});
  INFO("second daemon's stderr: " << second.err);
  CHECK(second.exit_code != 0);
  CHECK(second.exit_code != 124);  // refused at once, not stopped by `timeout`
  CHECK_THAT(second.err, Catch::Contains("pid " + pid));
  CHECK_THAT(second.err, Catch::Contains(socket));

  // The first daemon's sockets are where they were and it still answers, over gRPC on the live
  // client and on a fresh one, and over the session socket (a host buffer registers).
  CHECK(IsSocket(socket));
  CHECK(IsSocket(socket + ".session"));
  CHECK(live.client->GetStats().ok());
  auto fresh = client::Client::Connect(socket);
  REQUIRE(fresh.ok());
  auto stats = (*fresh)->GetStats();
  REQUIRE(stats.ok());
  auto buffer = (*fresh)->CreateHostBuffer(4096);
  REQUIRE(buffer.ok());
  v1::RegionSpec spec;
  spec.set_name("after the second daemon");
  CHECK((*fresh)->RegisterHostBuffer(**buffer, spec).ok());
}

}  // namespace
}  // namespace kvrail::testing
