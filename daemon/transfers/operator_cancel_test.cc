#include "daemon/transfers/operator_cancel.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace kvrail::transfers {
namespace {

sessions::Caller MakeCaller(int64_t uid) {
  sessions::Caller caller;
  caller.session_id = 7;
  caller.uid = uid;
  return caller;
}

TEST_CASE("root from a region-less session may cancel as the operator") {
  CHECK(MayCancelAsOperator(MakeCaller(0), /*session_owns_regions=*/false));
}

TEST_CASE("a root session that owns regions is a tenant") {
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(0), /*session_owns_regions=*/true));
}

// The defect: operator_role is also kvraild's own uid, which under MPS is every inference
// server's uid; a tenant opening a second session without regions could cancel anyone's transfer.
TEST_CASE("kvraild's own non-root uid may read but not cancel others' transfers") {
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(990), /*session_owns_regions=*/false));
  // This process stands for kvraild: its own uid has operator_role() (reads every status), which
  // still cancels nothing of others' unless it is root.
  const sessions::Caller own = MakeCaller(static_cast<int64_t>(::geteuid()));
  CHECK(own.operator_role());
  CHECK(MayCancelAsOperator(own, false) == (own.uid == 0));
}

TEST_CASE("anyone else is refused") {
  CHECK(MakeCaller(0).operator_role());
  const int64_t other = static_cast<int64_t>(::geteuid()) + 1;  // neither root nor kvraild's
  CHECK_FALSE(MakeCaller(other).operator_role());
  CHECK_FALSE(MakeCaller(-1).operator_role());
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(other), false));
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(1000), false));
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(-1), false));
}

v1::RegionInfo RegionOf(uint64_t session_id, const std::string& name, bool library) {
  v1::RegionInfo info;
  info.set_session_id(session_id);
  info.mutable_spec()->set_name(name);
  info.mutable_spec()->set_library_region(library);
  return info;
}

// The client library's block-table region is recognized by its flag (RegionSpec.library_region,
// limited by the daemon), not by its name: a tenant naming its own region "client block tables"
// stays a tenant. Before, the name alone made a region not count.
TEST_CASE("a region named like the library's block tables is the session's own region") {
  const std::vector<v1::RegionInfo> regions = {RegionOf(7, "client block tables", false)};
  CHECK(SessionOwnsRegions(regions, 7));
  CHECK_FALSE(MayCancelAsOperator(MakeCaller(0), SessionOwnsRegions(regions, 7)));
}

TEST_CASE("the library's flagged region alone leaves a root session region-less") {
  std::vector<v1::RegionInfo> regions = {RegionOf(7, "client block tables", true),
                                         RegionOf(8, "kv pool", false)};
  CHECK_FALSE(SessionOwnsRegions(regions, 7));
  CHECK(MayCancelAsOperator(MakeCaller(0), SessionOwnsRegions(regions, 7)));
  // Whatever the flagged region is named; and any other region of the session counts.
  regions[0].mutable_spec()->set_name("x");
  CHECK_FALSE(SessionOwnsRegions(regions, 7));
  regions.push_back(RegionOf(7, "kv pool", false));
  CHECK(SessionOwnsRegions(regions, 7));
}

}  // namespace
}  // namespace kvrail::transfers
