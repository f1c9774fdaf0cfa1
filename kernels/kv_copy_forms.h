// Every segment-path form of the copy kernel, for benchmarks and tests that compare them
// (segment_math.h: SegmentForm). The daemon links only //kernels:kv_copy, which builds the forms
// SegmentFormFor picks; this library builds the others too.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/kv_copy.h"
#include "kernels/segment_math.h"

namespace kvrail::kernels {

// LaunchKvCopy with the segment path's form `form` for a plan on the segment path
// (plan.segments, no pieces); other plans launch as LaunchKvCopy launches them.
absl::Status LaunchKvCopyForm(const DevicePlan& plan, uint32_t tile_begin, uint32_t tile_end,
                              int num_ctas, CudaStream stream, SegmentForm form,
                              int threads_per_cta = 512);

}  // namespace kvrail::kernels
