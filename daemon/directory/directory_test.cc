#include "daemon/directory/directory.h"

#include <catch2/catch.hpp>

namespace kvrail::directory {
namespace {

TEST_CASE("static directory: peers from config, self skipped, liveness states") {
  auto dir = CreateStaticDirectory({{"a", "10.0.0.1:1"}, {"b", "10.0.0.2:2"}}, "a");
  REQUIRE(dir->Peers().size() == 1);
  CHECK(dir->Lookup("a").status().code() == absl::StatusCode::kNotFound);
  auto b = dir->Lookup("b");
  REQUIRE(b.ok());
  CHECK(b->address == "10.0.0.2:2");
  CHECK(dir->List()[0].state() == v1::PEER_STATE_UNKNOWN);
  CHECK(dir->List()[0].last_seen_unix_us() == 0);
  dir->MarkUp("b", absl::FromUnixMicros(5), 77);
  CHECK(dir->List()[0].state() == v1::PEER_STATE_UP);
  CHECK(dir->List()[0].last_seen_unix_us() == 5);
  CHECK(dir->Lookup("b")->boot_id == 77);
  dir->MarkDown("b");
  CHECK(dir->List()[0].state() == v1::PEER_STATE_DOWN);
  CHECK(dir->List()[0].last_seen_unix_us() == 5);
}

}  // namespace
}  // namespace kvrail::directory
