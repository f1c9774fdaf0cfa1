// The planner's threaded piece, named apart from the pure planner: a TableCheckRunner
// (planner.h) that copies and checks a plan's two block tables on two threads when they are
// large. Pass it as PlanOptions::table_checks.
#pragma once

#include <cstddef>
#include <memory>

#include "daemon/planner/planner.h"

namespace kvrail::planner {

// Tables at least this large (both sides together) are done on two threads, the source's beside
// the destination's: a 262k + 262k-id submit spent ~1 ms copying and checking on the GPU
// machine's CPU before anything could move, and a thread costs tens of microseconds.
inline constexpr size_t kParallelTableIds = 65536;

// Runs the source's side on a new thread and the destination's on the caller's when `ids` >=
// `min_ids`, else both on the caller's thread. Thread-safe (no state beyond `min_ids`).
std::unique_ptr<TableCheckRunner> CreateParallelTableChecks(size_t min_ids = kParallelTableIds);

}  // namespace kvrail::planner
