#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include "proto/kvrail/v1/topology.pb.h"
#include "daemon/common/status.h"
#include <spdlog/spdlog.h>
extern "C" int SmokeLaunch();
TEST_CASE("smoke") { kvrail::v1::TopologyDesc p; p.set_hostname("x"); REQUIRE(p.hostname() == "x"); absl::Status s = absl::OkStatus(); REQUIRE(s.ok()); (void)&SmokeLaunch; }
