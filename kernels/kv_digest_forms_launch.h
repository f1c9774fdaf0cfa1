// Internal to kernels/: the nvcc-compiled entry point behind kv_digest_forms.h (plain C++, the
// result a cudaError_t as int).
#pragma once

#include <cstdint>

#include "kernels/device_abi.h"

struct CUstream_st;

namespace kvrail::kernels::internal {

// Any DigestKernelMode, as int (kv_digest.h). `staging`: as KvDigestLaunch's; kLaneCopies (no bulk
// copies) gives cudaErrorNotSupported for the benchmark modes that stage with bulk copies.
int KvDigestFormLaunch(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                       int mode, uint64_t* tile_digests, int num_ctas, int threads,
                       uint32_t access_bytes, uint32_t piece_bytes, int staging,
                       CUstream_st* stream);

}  // namespace kvrail::kernels::internal
