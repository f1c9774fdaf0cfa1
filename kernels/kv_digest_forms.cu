// Every digest mode (kv_digest_forms.h): the kernels of kv_digest_kernels.cuh instantiated for the
// benchmark modes as well as the daemon's.
#include <cuda_runtime.h>

#include "kernels/kv_digest_forms_launch.h"
#include "kernels/kv_digest_kernels.cuh"

namespace kvrail::kernels::internal {

int KvDigestFormLaunch(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                       int mode, uint64_t* tile_digests, int num_ctas, int threads,
                       uint32_t access_bytes, uint32_t piece_bytes, int staging,
                       CUstream_st* stream) {
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
    case kCopyNoHash:
      return LaunchMode<kCopyNoHash>(device_header, tile_begin, tile_end, num_ctas, threads,
                                     access_bytes, piece_bytes, tile_digests,
                                     static_cast<Staging>(staging), stream);
    case kCopyHashRegisters:
      return LaunchMode<kCopyHashRegisters>(device_header, tile_begin, tile_end, num_ctas, threads,
                                            access_bytes, piece_bytes, tile_digests,
                                            static_cast<Staging>(staging), stream);
    case kCopyHashCpAsync:
      return LaunchMode<kCopyHashCpAsync>(device_header, tile_begin, tile_end, num_ctas, threads,
                                          access_bytes, piece_bytes, tile_digests,
                                          static_cast<Staging>(staging), stream);
    case kCopyHashBulkLoad:
      return LaunchMode<kCopyHashBulkLoad>(device_header, tile_begin, tile_end, num_ctas, threads,
                                           access_bytes, piece_bytes, tile_digests,
                                           static_cast<Staging>(staging), stream);
    case kCopyNoHashBulkLoad:
      return LaunchMode<kCopyNoHashBulkLoad>(device_header, tile_begin, tile_end, num_ctas, threads,
                                             access_bytes, piece_bytes, tile_digests,
                                             static_cast<Staging>(staging), stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvrail::kernels::internal
