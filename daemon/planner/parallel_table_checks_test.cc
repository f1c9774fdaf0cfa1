// The threaded table checker: large tables copied and checked on two threads give exactly the
// plan and the errors of the pure planner's one-thread path.
#include "daemon/planner/parallel_table_checks.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/plan_fixtures.h"

namespace kvrail::planner {
namespace {

using kvrail::v1::TransferSpec;
using testing::ExpectError;
using testing::kNhd;
using testing::LargeSpec;
using testing::Paged;
using testing::Proto;

// MakePlan with the threaded runner (PlanOptions::table_checks).
absl::StatusOr<Plan> MakePlanThreaded(const TransferSpec& spec, const RegionView& src,
                                      const RegionView& dst) {
  static const std::unique_ptr<TableCheckRunner> runner = CreateParallelTableChecks();
  PlanOptions options;
  options.table_checks = runner.get();
  return MakePlan(spec, src, dst, options);
}

TEST_CASE("large tables (checked on two threads) report what a serial check would") {
  const uint32_t n = 40000;  // 80k ids in all: the two-thread path
  const RegionView r = Paged(Proto(1, 1, 2 * n, 16, 1, 64, kNhd));
  const TransferSpec s = LargeSpec(n);
  absl::StatusOr<Plan> good = MakePlanThreaded(s, r, r);
  REQUIRE(good.ok());
  CHECK(good->src_blocks()[12345] == (12345u * 7919u) % (2 * n));
  CHECK(good->dst_blocks()[n - 1] == n);
  // A bad source id and a repeated destination id: the source's error, as in a serial check.
  TransferSpec both = s;
  both.mutable_src()->set_block_ids(30000, 2 * n);
  both.mutable_dst()->set_block_ids(39999, both.dst().block_ids(7));
  ExpectError(MakePlanThreaded(both, r, r).status(), absl::StatusCode::kInvalidArgument,
              "spec.src.block_ids[30000]: block 80000 out of range");
  // The repeat alone: its index and its first occurrence.
  TransferSpec dup = s;
  dup.mutable_dst()->set_block_ids(39999, dup.dst().block_ids(7));
  ExpectError(MakePlanThreaded(dup, r, r).status(), absl::StatusCode::kInvalidArgument,
              "spec.dst.block_ids[39999]: block 79992 repeats spec.dst.block_ids[7]");
}

TEST_CASE("the runner uses a second thread only for large tables, and runs both sides") {
  const std::unique_ptr<TableCheckRunner> runner = CreateParallelTableChecks(100);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id src_on, dst_on;
  runner->RunBoth(
      99, [&] { src_on = std::this_thread::get_id(); },
      [&] { dst_on = std::this_thread::get_id(); });
  CHECK(src_on == caller);
  CHECK(dst_on == caller);
  runner->RunBoth(
      100, [&] { src_on = std::this_thread::get_id(); },
      [&] { dst_on = std::this_thread::get_id(); });
  CHECK(src_on != caller);
  CHECK(dst_on == caller);
}

}  // namespace
}  // namespace kvrail::planner
