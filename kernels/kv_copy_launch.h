// Internal to kernels/: the nvcc-compiled entry points behind kv_copy.h. Plain C++ (no CUDA or
// absl types) so both compilers agree; results are cudaError_t values as int (0 = success).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device_abi.h"
#include "kernels/segment_math.h"

struct CUstream_st;

namespace kvrail::kernels::internal {

int KvCopyLaunch(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                 int num_ctas, int threads, uint32_t access_bytes, uint32_t piece_bytes,
                 CUstream_st* stream);
// Stream-ordered (cudaMallocAsync / cudaFreeAsync): no device-wide synchronization, which a
// plain cudaFree would impose on every other stream of the device.
int DeviceAlloc(void** ptr, size_t bytes, CUstream_st* stream);
int DeviceFree(void* ptr, CUstream_st* stream);
// Enqueues the copy on `stream` (a pageable source is staged before this returns).
int CopyToDevice(void* dst, const void* src, size_t bytes, CUstream_st* stream);
// The segment path (plan_math.h: SegmentAt): warps move whole chunk segments.
// `segment_form`: DevicePlan::segment_form, one the daemon's library builds
// (IsDaemonSegmentForm: the default bulk-staged form, or the split form for short unmerged
// chunks); any other gives cudaErrorInvalidValue (kv_copy_forms.h launches those).
int KvCopySegmentsLaunch(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                         int num_ctas, int threads, SegmentForm segment_form, CUstream_st* stream);
// A one-thread kernel that fences (__threadfence_system) and then stores `value` at `word`.
int DoneWordStoreLaunch(uint64_t* word, uint64_t value, CUstream_st* stream);
// Launches every kernel variant once on an empty tile range and waits for `stream`: with lazy
// module loading (the CUDA 12 default) a kernel's first launch loads it, which can take
// milliseconds and synchronize the context; done at start it stays out of the first transfer.
// `bulk`: the GPU runs the bulk-copy forms (kernel_arch.h: HasBulkCopies); without it they are
// left out.
int WarmUpKernels(CUstream_st* stream, bool bulk);
// The current device's ordinal, its compute capability (major * 10 + minor) and the architecture
// its loaded code of this library was compiled for (the copy kernel's PTX version: 80 for
// compute_80 PTX JIT-compiled on an H100). Every kernel library is built with the same
// architectures (bazel/cuda.bzl), so this holds for all of them. Loads the module.
int ProbeKernelArch(int* device, int* device_cc, int* code_arch);
// The current device's ordinal (cheap: no module load).
int CurrentDevice(int* device);
const char* ErrorName(int error);
const char* ErrorString(int error);

}  // namespace kvrail::kernels::internal
