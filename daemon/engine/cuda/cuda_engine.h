// The CUDA engine (see docs/architecture.md, "CUDA engine"): one dispatcher thread and stream per
// GPU; each job runs on one GPU (scheduler::ExecutingDevice). It executes what
// //daemon/scheduler:cuda_batch_policy and :tile_queues decide (batches, mode, CTAs, order).
// The only engine target that links the CUDA runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/engine/cuda/cuda_engine_options.h"
#include "daemon/engine/engine.h"

namespace kvrail::engine {

// The engine is thread-safe (engine.h). FAILED_PRECONDITION (with the runtime's reason) when
// there is no driver or no GPU.
absl::StatusOr<std::unique_ptr<Engine>> CreateCudaEngine(const CudaEngineOptions& options);

}  // namespace kvrail::engine
