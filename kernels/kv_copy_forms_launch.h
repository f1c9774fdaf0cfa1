// Internal to kernels/: the nvcc-compiled entry point behind kv_copy_forms.h (plain C++, the
// result a cudaError_t as int).
#pragma once

#include <cstdint>

#include "kernels/device_abi.h"
#include "kernels/segment_math.h"

struct CUstream_st;

namespace kvrail::kernels::internal {

// Any SegmentForm (kDefault: kBulk3).
int KvCopySegmentsFormLaunch(const PlanHeader* device_header, uint32_t tile_begin,
                             uint32_t tile_end, int num_ctas, int threads, SegmentForm form,
                             CUstream_st* stream);

}  // namespace kvrail::kernels::internal
