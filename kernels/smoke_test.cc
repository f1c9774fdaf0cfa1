#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include "proto/kvrail/v1/smoke.grpc.pb.h"
#include "daemon/common/status.h"
#include <spdlog/spdlog.h>
extern "C" int SmokeLaunch();
TEST_CASE("smoke") { kvrail::v1::Ping p; p.set_a("x"); REQUIRE(p.a() == "x"); absl::Status s = absl::OkStatus(); REQUIRE(s.ok()); (void)&SmokeLaunch; }
