// The host engine: runs tiles with memcpy (the planner's host twin) on worker threads, in the
// order //daemon/scheduler:tile_queues decides (round robin within a class; background never
// takes the last free worker: scheduler::HostClassSlots).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "daemon/engine/engine.h"

namespace kvrail::engine {

// Runs tiles with memcpy on `threads` worker threads (the host twin of the kernels' arithmetic).
// The engine is thread-safe (engine.h); its table pool (Capabilities) recycles heap table buffers.
// A job of at most `inline_max_bytes` handed over by EnqueueAdmitted runs on the admitting thread
// (DaemonConfig.host_inline_max_bytes) when no tile of its priority class or a higher one is
// queued and its class may start one more tile; 0: every job goes to the workers.
std::unique_ptr<Engine> CreateHostEngine(int threads, const PriorityLimits& limits = {},
                                         uint64_t inline_max_bytes = 0);

// Tests only: called on the worker after a digest job's tile was copied and before its
// destination is read back (TransferSpec.digest), so a test can corrupt the landed bytes the way
// a faulty copy or a stale write would, and see the transfer fail with DATA_LOSS.
using TileLandedHook = std::function<void(const Job& job, uint32_t tile)>;
std::unique_ptr<Engine> CreateHostEngineForTest(int threads, TileLandedHook after_copy);

}  // namespace kvrail::engine
