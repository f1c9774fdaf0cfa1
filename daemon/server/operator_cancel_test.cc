#define CATCH_CONFIG_MAIN
#include "daemon/server/operator_cancel.h"

#include <catch2/catch.hpp>

namespace kvrail::server {
namespace {

regions::Caller MakeCaller(int64_t uid, bool operator_role) {
  regions::Caller caller;
  caller.session_id = 7;
  caller.uid = uid;
  caller.operator_role = operator_role;
  return caller;
}

TEST_CASE("root from a region-less session may cancel as the operator") {
  CHECK(MayCancelAsOperator(MakeCaller(0, true), /*session_owns_regions=*/false));
}

TEST_CASE("a root session that owns regions is a tenant") {
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(0, true), /*session_owns_regions=*/true));
}

// The defect: operator_role is also kvraild's own uid, which under MPS is every inference
// server's uid; a tenant opening a second session without regions could cancel anyone's transfer.
TEST_CASE("kvraild's own non-root uid may read but not cancel others' transfers") {
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(990, true), /*session_owns_regions=*/false));
}

TEST_CASE("anyone else is refused") {
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(1000, false), false));
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(-1, false), false));
}

}  // namespace
}  // namespace kvrail::server
