// The host engine: runs tiles with memcpy (the planner's host twin) on worker threads, in the
// order //daemon/scheduler:tile_queues decides (round robin within a class; background never
// takes the last free worker: scheduler::HostClassSlots).
#pragma once

#include <memory>

#include "daemon/engine/engine.h"

namespace kvrail::engine {

// Runs tiles with memcpy on `threads` worker threads (the host twin of the kernels' arithmetic).
// The engine is thread-safe (engine.h); its table_pool() recycles heap table buffers.
std::unique_ptr<Engine> CreateHostEngine(int threads, const PriorityLimits& limits = {});

}  // namespace kvrail::engine
