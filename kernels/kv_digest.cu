// The digest launches the daemon uses (kv_digest.h, kv_digest_launch.h); the kernels are in
// kv_digest_kernels.cuh, the benchmark modes in kv_digest_forms.cu.
#include <cuda_runtime.h>

#include "kernels/kv_digest_kernels.cuh"
#include "kernels/kv_digest_launch.h"

namespace kvrail::kernels {

namespace internal {

int KvDigestLaunch(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                   int mode, uint64_t* tile_digests, int num_ctas, int threads,
                   uint32_t access_bytes, uint32_t piece_bytes, int staging, CUstream_st* stream) {
  if (tile_end <= tile_begin) return cudaSuccess;
  if (threads > kMaxThreads || threads <= 0 || threads % 32 != 0 || num_ctas <= 0 ||
      tile_digests == nullptr) {
    return cudaErrorInvalidValue;
  }
  switch (mode) {
    case kCopyHashSource:
      return LaunchMode<kCopyHashSource>(device_header, tile_begin, tile_end, num_ctas, threads,
                                         access_bytes, piece_bytes, tile_digests,
                                         static_cast<Staging>(staging), stream);
    case kHashSource:
      return LaunchMode<kHashSource>(device_header, tile_begin, tile_end, num_ctas, threads,
                                     access_bytes, piece_bytes, tile_digests,
                                     static_cast<Staging>(staging), stream);
    case kHashDestination:
      return LaunchMode<kHashDestination>(device_header, tile_begin, tile_end, num_ctas, threads,
                                          access_bytes, piece_bytes, tile_digests,
                                          static_cast<Staging>(staging), stream);
    default:  // the benchmark modes: kv_digest_forms.cu
      return cudaErrorInvalidValue;
  }
}

int DigestZero(uint64_t* digests, size_t count, CUstream_st* stream) {
  return cudaMemsetAsync(digests, 0, count * sizeof(uint64_t), stream);
}

int DigestToHost(uint64_t* host, const uint64_t* digests, size_t count, CUstream_st* stream) {
  const int e =
      cudaMemcpyAsync(host, digests, count * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(stream);
}

int DigestDeviceAlloc(void** ptr, size_t bytes, CUstream_st* stream) {
  return cudaMallocAsync(ptr, bytes, stream);
}
int DigestDeviceFree(void* ptr, CUstream_st* stream) { return cudaFreeAsync(ptr, stream); }
int DigestHostAlloc(void** ptr, size_t bytes) { return cudaMallocHost(ptr, bytes); }
int DigestHostFree(void* ptr) { return cudaFreeHost(ptr); }
int DigestCopyToHostAsync(uint64_t* host, const uint64_t* device, size_t count,
                          CUstream_st* stream) {
  return cudaMemcpyAsync(host, device, count * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream);
}

const char* DigestErrorName(int error) { return cudaGetErrorName(static_cast<cudaError_t>(error)); }
const char* DigestErrorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // namespace internal
}  // namespace kvrail::kernels
