// Issue 19 (first transfer): making the manager builds what the first Submit used to build after
// its "submitted" stamp (the generated descriptors behind v1::Path_Name, ~350-450 us on the
// build machine). Alone in its binary: nothing else in the process may have built them first.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "daemon/planner/parallel_table_checks.h"
#include "daemon/planner/table_pool.h"
#include "daemon/transfers/manager_impl.h"
#include "daemon/transfers/manager_fixture.h"
#include "google/protobuf/descriptor.h"

namespace kvrail::transfers::testing {
namespace {

bool TransferProtoBuilt() {
  return google::protobuf::DescriptorPool::generated_pool()->InternalIsFileLoaded(
      "proto/kvrail/v1/transfer.proto");
}

TEST_CASE("making the transfer manager builds the descriptors the first Submit would build") {
  REQUIRE_FALSE(TransferProtoBuilt());  // the test means something only from a cold process
  ManagerFixture f;
  CHECK(TransferProtoBuilt());
  // And the first transfer still runs as any other.
  const uint64_t id = f.Submit(2);
  f.engine.RunAll();
  CHECK(f.Get(id).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE("the planner warm-up makes a deferred-check plan through the given table pool") {
  std::shared_ptr<planner::TablePool> pool =
      planner::TablePool::Create(planner::TablePool::Heap(), 64 << 20);
  std::unique_ptr<planner::TableCheckRunner> checks = planner::CreateParallelTableChecks();
  planner::PlanOptions options;
  options.tables = pool.get();
  options.table_checks = checks.get();
  options.defer_checks_from = 32768;
  REQUIRE(WarmPlanner(options, 16384).ok());
  CHECK(pool->allocations() >= 2);  // both sides' tables came from the pool ...
  CHECK(pool->free_bytes() >= 2 * 4 * 16384);  // ... and went back with the plan
}

}  // namespace
}  // namespace kvrail::transfers::testing
