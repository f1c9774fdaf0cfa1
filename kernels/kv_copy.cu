// The fused gather/scatter kernel (see kv_copy.h) and the nvcc-side entry points.
#include <cuda_runtime.h>

#include "kernels/device_abi.h"
#include "kernels/gather_common.cuh"
#include "kernels/kv_copy_launch.h"
#include "kernels/kv_copy_segments.cuh"
#include "kernels/plan_math.h"
#include "kernels/segment_math.h"

namespace kvrail::kernels {
namespace {

using gather::kLoadsInFlight;
constexpr int kMaxThreads = 512;

using gather::Access;
using gather::ItemPos;
using gather::LoadHeader;
using gather::LocateSlab;
using gather::SlabAddr;
using gather::SplitItem;

// Each CTA grid-strides over "slabs": blockDim.x * kLoadsInFlight accesses of W bytes inside one
// tile. Thread t handles accesses t, t + blockDim.x, ... of the slab, so a warp's accesses are
// consecutive stream bytes (coalesced whenever chunks are larger than a few accesses). All loads
// of a slab are issued before any store, and the next slab is located (its block-table reads)
// while those loads are in flight, so table and data latencies overlap instead of adding up.
template <int W>
__global__ void __launch_bounds__(kMaxThreads)
    KvCopyKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin, uint32_t tile_end) {
  using T = typename Access<W>::T;
  __shared__ PlanHeader h;
  LoadHeader(header, &h);
  if (h.num_tiles == 0) return;  // a gated job that ended (the CUDA engine disarmed it)
  const uint8_t* __restrict__ src = reinterpret_cast<const uint8_t*>(h.src.base);
  uint8_t* __restrict__ dst = reinterpret_cast<uint8_t*>(h.dst.base);
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);

  const uint32_t slab_bytes = blockDim.x * kLoadsInFlight * W;
  const uint64_t slabs_per_tile = (h.tile_bytes + slab_bytes - 1) / slab_bytes;
  const FastDivU32 slabs_div = MakeFastDiv(
      static_cast<uint32_t>(slabs_per_tile <= kFastDivMaxDividend ? slabs_per_tile : 1));
  const uint64_t items = static_cast<uint64_t>(tile_end - tile_begin) * slabs_per_tile;

  SlabAddr a;
  uint64_t item = blockIdx.x;
  if (item < items) {
    LocateSlab<W>(h, src_blocks, dst_blocks, tile_begin, item, slabs_div, slabs_per_tile,
                  slab_bytes, a);
  }
  while (item < items) {
    T value[kLoadsInFlight];
    uint64_t to[kLoadsInFlight];
    const uint32_t len = a.len;
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t off = (k * blockDim.x + threadIdx.x) * W;
      if (off < len) value[k] = *reinterpret_cast<const T*>(src + a.from[k]);
      to[k] = a.to[k];
    }
    const uint64_t next = item + gridDim.x;
    if (next < items) {
      LocateSlab<W>(h, src_blocks, dst_blocks, tile_begin, next, slabs_div, slabs_per_tile,
                    slab_bytes, a);
    }
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t off = (k * blockDim.x + threadIdx.x) * W;
      if (off < len) *reinterpret_cast<T*>(dst + to[k]) = value[k];
    }
    item = next;
  }
}

// The warp path (plan_math.h: PieceBytesFor): each warp moves whole pieces of P <= 4 KiB, one
// chunk lookup per piece; lane l moves 16-byte vectors l, l + 32, ... of it, all loads issued
// before the stores (P / 512 <= 8 per lane in flight). Needs 16-byte access and P | tile_bytes.
__global__ void __launch_bounds__(kMaxThreads)
    KvCopyPiecesKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin,
                       uint32_t tile_end, uint32_t piece_bytes) {
  __shared__ PlanHeader h;
  LoadHeader(header, &h);
  if (h.num_tiles == 0) return;  // a gated job that ended (the CUDA engine disarmed it)
  const uint8_t* __restrict__ src = reinterpret_cast<const uint8_t*>(h.src.base);
  uint8_t* __restrict__ dst = reinterpret_cast<uint8_t*>(h.dst.base);
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warps_per_cta = blockDim.x / 32;
  const uint64_t pieces_per_tile = h.tile_bytes / piece_bytes;
  const FastDivU32 tile_div = MakeFastDiv(
      pieces_per_tile <= kFastDivMaxDividend ? static_cast<uint32_t>(pieces_per_tile) : 1);
  const uint64_t items = static_cast<uint64_t>(tile_end - tile_begin) * pieces_per_tile;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * warps_per_cta;
  for (uint64_t item = static_cast<uint64_t>(blockIdx.x) * warps_per_cta + threadIdx.x / 32;
       item < items; item += step) {
    const ItemPos pos = SplitItem(item, pieces_per_tile, tile_div);
    const TileDesc t = TileAt(h, tile_begin + static_cast<uint32_t>(pos.tile));
    const ChunkSpan span = PieceAt(h, src_blocks, dst_blocks, t, pos.index, piece_bytes);
    const int4* from = reinterpret_cast<const int4*>(src + span.src);
    int4* to = reinterpret_cast<int4*>(dst + span.dst);
    const uint32_t vectors = static_cast<uint32_t>(span.bytes / 16);
    int4 value[kLoadsInFlight];
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t v = k * 32 + lane;
      if (v < vectors) value[k] = from[v];
    }
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t v = k * 32 + lane;
      if (v < vectors) to[v] = value[k];
    }
  }
}
static_assert(kMaxPieceBytes == kLoadsInFlight * 32 * 16, "one piece = one warp step");

}  // namespace

namespace internal {

int KvCopyLaunch(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                 int num_ctas, int threads, uint32_t access_bytes, uint32_t piece_bytes,
                 CUstream_st* stream) {
  if (tile_end <= tile_begin) return cudaSuccess;
  if (threads > kMaxThreads || threads <= 0 || num_ctas <= 0) return cudaErrorInvalidValue;
  const dim3 grid(num_ctas), block(threads);
  if (piece_bytes != 0) {
    if (access_bytes != 16 || piece_bytes > kMaxPieceBytes || piece_bytes % 16 != 0) {
      return cudaErrorInvalidValue;
    }
    KvCopyPiecesKernel<<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end,
                                                   piece_bytes);
    return cudaGetLastError();
  }
  switch (access_bytes) {
    case 16:
      KvCopyKernel<16><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end);
      break;
    case 8:
      KvCopyKernel<8><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end);
      break;
    case 4:
      KvCopyKernel<4><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end);
      break;
    case 2:
      KvCopyKernel<2><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end);
      break;
    case 1:
      KvCopyKernel<1><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

int KvCopySegmentsLaunch(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                         int num_ctas, int threads, SegmentForm segment_form, CUstream_st* stream) {
  if (tile_end <= tile_begin) return cudaSuccess;
  if (threads > kMaxThreads || threads <= 0 || threads % 32 != 0 || num_ctas <= 0) {
    return cudaErrorInvalidValue;
  }
  // The forms SegmentFormFor picks; the benchmark forms are built into //kernels:kv_copy_forms
  // only (kv_copy.cc refuses them before this).
  switch (segment_form) {
    case SegmentForm::kDefault:
    case SegmentForm::kBulk3:
      return LaunchBulkSegments<kDefaultBulkStages>(device_header, tile_begin, tile_end, num_ctas,
                                                    threads, stream);
    case SegmentForm::kSplit6:
      return LaunchSplitSegments<6, 1>(device_header, tile_begin, tile_end, num_ctas, threads,
                                       stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// One thread: every write this stream ran before it is made visible to the host (the fence),
// then the word. Launched behind a transfer's last copy (kv_copy.h: LaunchDoneWordStore).
__global__ void DoneWordStoreKernel(unsigned long long* word, unsigned long long value) {
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(word) = value;
}

int DoneWordStoreLaunch(uint64_t* word, uint64_t value, CUstream_st* stream) {
  DoneWordStoreKernel<<<1, 1, 0, stream>>>(reinterpret_cast<unsigned long long*>(word),
                                           static_cast<unsigned long long>(value));
  return cudaGetLastError();
}

int WarmUpKernels(CUstream_st* stream, bool bulk) {
  PlanHeader* header = nullptr;
  cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&header), sizeof(PlanHeader), stream);
  if (e != cudaSuccess) return e;
  // A zero header: no tiles, every kernel returns after reading it.
  e = cudaMemsetAsync(header, 0, sizeof(PlanHeader), stream);
  const dim3 grid(1), block(32);
  if (e == cudaSuccess) {
    KvCopyPiecesKernel<<<grid, block, 0, stream>>>(header, 0, 0, kMaxPieceBytes);
    KvCopySegmentsSplitKernel<6, 1><<<grid, block, 0, stream>>>(header, 0, 0);
    if (bulk) {
      KvCopySegmentsBulkKernel<kDefaultBulkStages><<<grid, block, 0, stream>>>(header, 0, 0, 0);
    }
    KvCopyKernel<16><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopyKernel<8><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopyKernel<4><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopyKernel<2><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopyKernel<1><<<grid, block, 0, stream>>>(header, 0, 0);
    // Its own harmless store: into the zero header's first word, which nothing reads after.
    DoneWordStoreKernel<<<1, 1, 0, stream>>>(reinterpret_cast<unsigned long long*>(header), 0);
    e = cudaGetLastError();
  }
  const cudaError_t freed = cudaFreeAsync(header, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return e;
  return freed != cudaSuccess ? freed : synced;
}

int ProbeKernelArch(int* device, int* device_cc, int* code_arch) {
  cudaError_t e = cudaGetDevice(device);
  if (e != cudaSuccess) return e;
  int major = 0, minor = 0;
  e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, *device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, *device);
  if (e != cudaSuccess) return e;
  *device_cc = 10 * major + minor;
  cudaFuncAttributes attr;
  e = cudaFuncGetAttributes(&attr, KvCopyKernel<16>);
  if (e != cudaSuccess) return e;
  *code_arch = attr.ptxVersion;
  return cudaSuccess;
}

int CurrentDevice(int* device) { return cudaGetDevice(device); }

int DeviceAlloc(void** ptr, size_t bytes, CUstream_st* stream) {
  return cudaMallocAsync(ptr, bytes, stream);
}
int DeviceFree(void* ptr, CUstream_st* stream) { return cudaFreeAsync(ptr, stream); }

int CopyToDevice(void* dst, const void* src, size_t bytes, CUstream_st* stream) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
}

const char* ErrorName(int error) { return cudaGetErrorName(static_cast<cudaError_t>(error)); }
const char* ErrorString(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // namespace internal
}  // namespace kvrail::kernels
