// Every segment-path form (kv_copy_forms.h): the kernels of kv_copy_segments.cuh instantiated for
// the benchmark forms as well as the daemon's.
#include <cuda_runtime.h>

#include "kernels/device_abi.h"
#include "kernels/kv_copy_forms_launch.h"
#include "kernels/kv_copy_segments.cuh"
#include "kernels/segment_math.h"

namespace kvrail::kernels::internal {

int KvCopySegmentsFormLaunch(const PlanHeader* device_header, uint32_t tile_begin,
                             uint32_t tile_end, int num_ctas, int threads, SegmentForm form,
                             CUstream_st* stream) {
  if (tile_end <= tile_begin) return cudaSuccess;
  if (threads > segments::kMaxThreads || threads <= 0 || threads % 32 != 0 || num_ctas <= 0) {
    return cudaErrorInvalidValue;
  }
  switch (form) {
    case SegmentForm::kRegisters:
      KvCopySegmentsKernel<kDefaultUnitsPerLane>
          <<<num_ctas, threads, 0, stream>>>(device_header, tile_begin, tile_end);
      return cudaGetLastError();
    case SegmentForm::kBulk2:
      return LaunchBulkSegments<2>(device_header, tile_begin, tile_end, num_ctas, threads, stream);
    case SegmentForm::kDefault:
    case SegmentForm::kBulk3:
      return LaunchBulkSegments<3>(device_header, tile_begin, tile_end, num_ctas, threads, stream);
    case SegmentForm::kSplit4:
      return LaunchSplitSegments<4, 1>(device_header, tile_begin, tile_end, num_ctas, threads,
                                       stream);
    case SegmentForm::kSplit6:
      return LaunchSplitSegments<6, 1>(device_header, tile_begin, tile_end, num_ctas, threads,
                                       stream);
    case SegmentForm::kSplit4x2:
      return LaunchSplitSegments<4, 2>(device_header, tile_begin, tile_end, num_ctas, threads,
                                       stream);
    case SegmentForm::kSplit6x2:
      return LaunchSplitSegments<6, 2>(device_header, tile_begin, tile_end, num_ctas, threads,
                                       stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvrail::kernels::internal
