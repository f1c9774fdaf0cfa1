// Start-up work that would otherwise land in the first transfer, on the dispatcher's thread
// before it serves: the kernels' lazy module load, the stream-ordered pool keeping its memory
// between plans, the CTA knees seeded and the copy engines' cost per run measured (into
// `tuners`). CUDA only.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "daemon/engine/cuda/cuda_engine_options.h"
#include "daemon/engine/cuda/tuners.h"

namespace kvrail::engine::cuda_detail {

// The Describe text ("warmed up in ... ms ..."). A failed part costs only speed.
absl::StatusOr<std::string> WarmUp(int device, const CudaEngineOptions& options, Tuners& tuners);

}  // namespace kvrail::engine::cuda_detail
