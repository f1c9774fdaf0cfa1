// Internal to kernels/: the nvcc-compiled entry points behind kv_digest.h. Plain C++ (no CUDA or
// absl types); results are cudaError_t values as int (0 = success).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device_abi.h"

struct CUstream_st;

namespace kvrail::kernels::internal {

// `mode`: DigestKernelMode as int, one the daemon launches (1 copy + hash source, 2 hash source,
// 3 hash destination); the benchmark modes 4-8 give cudaErrorInvalidValue (kv_digest_forms.h).
// `staging`: kernel_arch.h's DigestStaging as int, for the GPU that runs it (DigestStagingOn).
int KvDigestLaunch(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                   int mode, uint64_t* tile_digests, int num_ctas, int threads,
                   uint32_t access_bytes, uint32_t piece_bytes, int staging, CUstream_st* stream);
int DigestZero(uint64_t* digests, size_t count, CUstream_st* stream);
// Copies `count` digests to host memory and waits for the stream.
int DigestToHost(uint64_t* host, const uint64_t* digests, size_t count, CUstream_st* stream);
// Stream-ordered device memory, and pinned host memory (cudaMallocHost / cudaFreeHost).
int DigestDeviceAlloc(void** ptr, size_t bytes, CUstream_st* stream);
int DigestDeviceFree(void* ptr, CUstream_st* stream);
int DigestHostAlloc(void** ptr, size_t bytes);
int DigestHostFree(void* ptr);
// Enqueues a device -> host copy (the host memory pinned).
int DigestCopyToHostAsync(uint64_t* host, const uint64_t* device, size_t count,
                          CUstream_st* stream);
const char* DigestErrorName(int error);
const char* DigestErrorString(int error);

}  // namespace kvrail::kernels::internal
