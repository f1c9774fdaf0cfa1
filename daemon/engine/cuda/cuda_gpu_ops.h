// GpuOps on the CUDA runtime (and the driver's stream word ops through its entry points) for
// one GPU: what the engine's parts run on in the daemon.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/engine/cuda/gpu_ops.h"

namespace kvrail::engine::cuda_detail {

// `device`'s ops, with the main stream made there. Call from a thread bound to `device`.
absl::StatusOr<std::unique_ptr<GpuOps>> CreateCudaGpuOps(int device);

}  // namespace kvrail::engine::cuda_detail
