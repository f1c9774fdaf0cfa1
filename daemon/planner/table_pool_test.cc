// The pooled table memory (TablePool): recycling by size class within retain_bytes, holders,
// failed and capped allocations, pools outliving or outlived by plans, and plans handing their
// tables back (ReleaseBlockTables).
#include "daemon/planner/table_pool.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/plan_fixtures.h"

namespace kvrail::planner {
namespace {

using testing::ExpectError;
using testing::kNhd;
using testing::Paged;
using testing::Proto;
using testing::Spec;

TEST_CASE("ReleaseBlockTables frees the tables and keeps the header") {
  const RegionView view = Paged(Proto(2, 2, 64, 16, 1, 128, kNhd));
  std::shared_ptr<TablePool> pool = TablePool::Create(TablePool::Heap(), 1 << 20);
  PlanOptions options;
  options.tables = pool.get();
  absl::StatusOr<Plan> plan = MakePlan(Spec({3, 1, 2}, {4, 5, 6}), view, view, options);
  REQUIRE(plan.ok());
  CHECK(pool->free_bytes() == 0);
  const kernels::PlanHeader before = plan->header();
  const uint32_t tiles = plan->num_tiles();
  const TileInfo last = plan->tile(tiles - 1);
  plan->ReleaseBlockTables();
  CHECK(plan->src_blocks().empty());
  CHECK(plan->dst_blocks().empty());
  CHECK(pool->free_bytes() == 2 * 4096);  // both tables back in the pool (one page each)
  CHECK(std::memcmp(&plan->header(), &before, sizeof(before)) == 0);
  CHECK(plan->num_tiles() == tiles);
  CHECK(plan->tile(tiles - 1).bytes == last.bytes);
}

TEST_CASE("TablePool recycles buffers by size class and keeps at most retain_bytes") {
  int allocated = 0, released = 0;
  TablePool::Allocator counting = TablePool::Heap();
  counting.allocate = [&allocated, heap = counting.allocate](size_t bytes) {
    ++allocated;
    return heap(bytes);
  };
  counting.release = [&released, heap = counting.release](void* memory) {
    ++released;
    heap(memory);
  };
  std::shared_ptr<TablePool> pool = TablePool::Create(counting, 64 << 10);
  void* first = nullptr;
  {
    BlockTable t = BlockTable::Allocate(10000, pool.get());  // 40000 B: the 64 KiB class
    REQUIRE(t.ok());
    first = t.data();
    t.data()[9999] = 7;
  }
  CHECK(pool->free_bytes() == (64 << 10));
  {
    BlockTable again = BlockTable::Allocate(16000, pool.get());  // same class: same buffer
    CHECK(again.data() == first);
    BlockTable other = BlockTable::Allocate(100, pool.get());  // another class: a new one
    CHECK(other.data() != first);
    CHECK(pool->free_bytes() == 0);
    // A holder (an upload in flight) keeps the memory out of the pool after the table is gone.
    std::shared_ptr<const void> held = again.Hold();
    again = BlockTable();
    CHECK(pool->free_bytes() == 0);
    held.reset();
    CHECK(pool->free_bytes() == (64 << 10));
  }
  // `other` (4 KiB) would pass the 64 KiB kept: released, not kept.
  CHECK(pool->free_bytes() == (64 << 10));
  CHECK(allocated == 2);
  CHECK(released == 1);
  CHECK(pool->allocations() == 2);
  pool.reset();
  CHECK(released == 2);  // the kept buffer goes when the pool does
}

TEST_CASE("TablePool: a failed allocation is a RESOURCE_EXHAUSTED naming the table") {
  TablePool::Allocator failing = TablePool::Heap();
  failing.allocate = [](size_t) -> void* { return nullptr; };
  std::shared_ptr<TablePool> pool = TablePool::Create(failing, 0);
  PlanOptions options;
  options.tables = pool.get();
  const RegionView view = Paged(Proto(2, 2, 64, 16, 1, 128, kNhd));
  ExpectError(MakePlan(Spec({3, 1, 2}, {4, 5, 6}), view, view, options).status(),
              absl::StatusCode::kResourceExhausted, "spec.src.block_ids: no memory");
  // A pinned pool whose allocator fails hands out heap memory instead (not pinned, not kept).
  TablePool::Allocator capped = failing;
  capped.pinned = true;
  std::shared_ptr<TablePool> pinned = TablePool::Create(capped, 1 << 20);
  options.tables = pinned.get();
  {
    absl::StatusOr<Plan> fell_back = MakePlan(Spec({3, 1, 2}, {4, 5, 6}), view, view, options);
    REQUIRE(fell_back.ok());
    CHECK(!fell_back->src_blocks().pinned());
    CHECK(fell_back->dst_blocks()[1] == 5);
    CHECK(pinned->fallbacks() == 2);
  }
  CHECK(pinned->free_bytes() == 0);
  // A plan that outlives its pool keeps the pool's memory valid.
  std::shared_ptr<TablePool> heap = TablePool::Create(TablePool::Heap(), 1 << 20);
  options.tables = heap.get();
  absl::StatusOr<Plan> plan = MakePlan(Spec({3, 1, 2}, {4, 5, 6}), view, view, options);
  REQUIRE(plan.ok());
  heap.reset();
  CHECK(plan->src_blocks()[0] == 3);
  CHECK(plan->dst_blocks()[2] == 6);
}

TEST_CASE("without an allocator, tables come from the heap (not pinned)") {
  const RegionView view = Paged(Proto(2, 2, 64, 16, 1, 128, kNhd));
  absl::StatusOr<Plan> plan = MakePlan(Spec({3, 1, 2}, {4, 5, 6}), view, view, PlanOptions{});
  REQUIRE(plan.ok());
  CHECK(!plan->src_blocks().pinned());
  CHECK(plan->src_blocks()[1] == 1);
  CHECK(plan->dst_blocks()[2] == 6);
}

}  // namespace
}  // namespace kvrail::planner
