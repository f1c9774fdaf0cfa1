// The fused gather/scatter kernel (see kv_copy.h) and the nvcc-side entry points.
#include <cuda_runtime.h>

#include "kernels/device_abi.h"
#include "kernels/gather_common.cuh"
#include "kernels/kv_copy_launch.h"
#include "kernels/plan_math.h"

namespace kvrail::kernels {
namespace {

// Loads kept in flight per thread: enough independent 16-byte loads to cover NVLink / HBM
// latency with few CTAs (measured: 8 CTAs x 512 threads x 8 loads ~ 300-350 GB/s on H200).
constexpr int kLoadsInFlight = 8;
constexpr int kMaxThreads = 512;

using gather::Access;
using gather::ItemPos;
using gather::LoadHeader;
using gather::SplitItem;

// Addresses of one slab (see KvCopyKernel), relative to the region bases.
struct SlabAddr {
  uint64_t from[kLoadsInFlight];
  uint64_t to[kLoadsInFlight];
  uint32_t len;  // bytes of the slab; 0 past the end of a short last tile
};

// Locates slab `item` of the launch's tile range. Divisions are 32-bit fast divisions whenever the
// values allow (they nearly always do); block-table reads happen here.
template <int W>
__device__ __forceinline__ void LocateSlab(const PlanHeader& h, const uint32_t* src_blocks,
                                           const uint32_t* dst_blocks, uint32_t tile_begin,
                                           uint64_t item, const FastDivU32& slabs_div,
                                           uint64_t slabs_per_tile, uint32_t slab_bytes,
                                           SlabAddr& a) {
  const ItemPos pos = SplitItem(item, slabs_per_tile, slabs_div);
  const TileDesc t = TileAt(h, tile_begin + static_cast<uint32_t>(pos.tile));
  const uint64_t begin = t.byte_begin + pos.index * slab_bytes;
  if (begin >= t.byte_end) {  // the last tile of a stream is shorter
    a.len = 0;
    return;
  }
  const uint64_t left = t.byte_end - begin;
  a.len = left < slab_bytes ? static_cast<uint32_t>(left) : slab_bytes;
  if (static_cast<ChunkKind>(h.chunk_kind) == ChunkKind::kBytes) {
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t off = (k * blockDim.x + threadIdx.x) * W;
      a.from[k] = h.src.origin + begin + off;
      a.to[k] = h.dst.origin + begin + off;
    }
    return;
  }
  ChunkPos start;
  if (begin <= kFastDivMaxDividend) {
    start.chunk = FastDiv(h.chunk_div, static_cast<uint32_t>(begin));
    start.offset = static_cast<uint32_t>(begin) - start.chunk * static_cast<uint32_t>(h.chunk_bytes);
  } else {
    start.chunk = static_cast<uint32_t>(begin / h.chunk_bytes);
    start.offset = static_cast<uint32_t>(begin % h.chunk_bytes);
  }
  // A slab lies in one tile, hence one layer: its layer offsets (a table read on per-layer sides)
  // once.
  const LayerSpan layer = LayerAt(h, t.layer);
#pragma unroll
  for (int k = 0; k < kLoadsInFlight; ++k) {
    const uint32_t off = (k * blockDim.x + threadIdx.x) * W;
    if (off < a.len) {
      const ChunkPos pos = AdvanceChunkPos(h, start, off);
      const ChunkSpan span = ChunkAtInLayer(h, src_blocks, dst_blocks, layer, t.part, pos.chunk);
      a.from[k] = span.src + pos.offset;
      a.to[k] = span.dst + pos.offset;
    }
  }
}

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
  const uint8_t* __restrict__ src = reinterpret_cast<const uint8_t*>(h.src.base);
  uint8_t* __restrict__ dst = reinterpret_cast<uint8_t*>(h.dst.base);
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);

  const uint32_t slab_bytes = blockDim.x * kLoadsInFlight * W;
  const uint64_t slabs_per_tile = (h.tile_bytes + slab_bytes - 1) / slab_bytes;
  const FastDivU32 slabs_div =
      MakeFastDiv(static_cast<uint32_t>(slabs_per_tile <= kFastDivMaxDividend ? slabs_per_tile : 1));
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

// The segment path (plan_math.h: SegmentAt): each warp takes kSegmentsPerStep consecutive
// segments at a time, lane j < kSegmentsPerStep locating segment j (one chunk lookup per segment;
// the next step's lookups are issued before this step's copies, so block-table and data
// latencies overlap). Every segment is cut at 8-byte boundaries of its DESTINATION: a head
// (< 8 bytes) and a tail (< 8 bytes) moved bytewise, and a body of aligned 8-byte stores whose
// bytes come from the source's aligned 8-byte words funnel-shifted by the source's misalignment
// (two loads, one mostly from L1). So odd vector sizes, odd offsets and padded strides move in
// 8-byte accesses, not at the plan's narrowest width. Each aligned word read holds at least one
// byte of the segment, so no read leaves the pages the segment lies in. The bodies of the step's
// segments are one stream of words (each lane finds its word's segment by comparing with the
// running word counts and takes that segment's bases from its lane by shuffle), of which each
// lane keeps kSegmentLoads loads in flight.
constexpr int kSegmentsPerStep = 8;
constexpr int kSegmentLoads = 8;

struct SegmentPlan {
  uint64_t src, dst;  // segment start (addresses)
  uint32_t head;      // bytes before the destination's first 8-byte boundary (or all, if short)
  uint32_t words;     // 8-byte body words
  uint32_t tail;      // bytes after the body
};

__device__ __forceinline__ SegmentPlan PlanSegment(uint64_t src, uint64_t dst, uint64_t len) {
  SegmentPlan s;
  s.src = src;
  s.dst = dst;
  const uint32_t a = static_cast<uint32_t>((8 - (dst & 7)) & 7);
  if (a >= len) {
    s.head = static_cast<uint32_t>(len);
    s.words = 0;
    s.tail = 0;
  } else {
    s.head = a;
    s.words = static_cast<uint32_t>((len - a) / 8);
    s.tail = static_cast<uint32_t>(len - a - 8ull * s.words);
  }
  return s;
}

// The 8 bytes at `at` (any alignment), from the aligned words holding them.
__device__ __forceinline__ uint64_t LoadFunnel(uint64_t at) {
  const uint32_t r = static_cast<uint32_t>(at & 7);
  const uint64_t* aligned = reinterpret_cast<const uint64_t*>(at - r);
  const uint64_t lo = aligned[0];
  if (r == 0) return lo;
  const uint64_t hi = aligned[1];
  return (lo >> (8 * r)) | (hi << (64 - 8 * r));
}

// Segment `item` of the launch (lanes with nothing to locate get an empty one).
__device__ __forceinline__ ChunkSpan LocateSegment(const PlanHeader& h, const uint32_t* src_blocks,
                                                   const uint32_t* dst_blocks, uint32_t tile_begin,
                                                   uint64_t item, uint64_t items,
                                                   uint64_t per_tile, const FastDivU32& div) {
  if (item >= items) return ChunkSpan{0, 0, 0};
  const ItemPos pos = SplitItem(item, per_tile, div);
  const TileDesc t = TileAt(h, tile_begin + static_cast<uint32_t>(pos.tile));
  return SegmentAt(h, src_blocks, dst_blocks, t, pos.index);
}

__global__ void __launch_bounds__(kMaxThreads)
    KvCopySegmentsKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin,
                         uint32_t tile_end) {
  __shared__ PlanHeader h;
  LoadHeader(header, &h);
  const uint64_t src = h.src.base;
  const uint64_t dst = h.dst.base;
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t per_tile = SegmentsPerTile(h);
  const FastDivU32 tile_div =
      MakeFastDiv(per_tile <= kFastDivMaxDividend ? static_cast<uint32_t>(per_tile) : 1);
  const uint64_t items = static_cast<uint64_t>(tile_end - tile_begin) * per_tile;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t warp = static_cast<uint64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const uint64_t stride = warps * kSegmentsPerStep;
  uint64_t first = warp * kSegmentsPerStep;
  // Lane j < kSegmentsPerStep locates segment first + j; the others hold an empty segment.
  ChunkSpan next = lane < kSegmentsPerStep
                       ? LocateSegment(h, src_blocks, dst_blocks, tile_begin, first + lane, items,
                                       per_tile, tile_div)
                       : ChunkSpan{0, 0, 0};
  for (; first < items; first += stride) {
    const SegmentPlan mine = PlanSegment(src + next.src, dst + next.dst, next.bytes);
    // The next step's lookups, issued now: their table reads overlap this step's copies.
    if (lane < kSegmentsPerStep) {
      next = LocateSegment(h, src_blocks, dst_blocks, tile_begin, first + stride + lane, items,
                           per_tile, tile_div);
    }
    // Running word counts over the step's segments (lanes >= kSegmentsPerStep add 0 words).
    uint32_t end = lane < kSegmentsPerStep ? mine.words : 0;
#pragma unroll
    for (int d = 1; d < kSegmentsPerStep; d *= 2) {
      const uint32_t up = __shfl_up_sync(0xffffffffu, end, d);
      if (lane >= static_cast<uint32_t>(d)) end += up;
    }
    uint32_t ends[kSegmentsPerStep];
#pragma unroll
    for (int q = 0; q < kSegmentsPerStep; ++q) ends[q] = __shfl_sync(0xffffffffu, end, q);
    const uint32_t total = ends[kSegmentsPerStep - 1];
    // Word v of segment j is at (my_dst + 8 v, my_src + 8 v) in lane j's terms.
    const uint64_t start = 8ull * (end - (lane < kSegmentsPerStep ? mine.words : 0));
    const uint64_t my_dst = mine.dst + mine.head - start;
    const uint64_t my_src = mine.src + mine.head - start;
    for (uint32_t base = 0; base < total; base += 32 * kSegmentLoads) {
      uint64_t value[kSegmentLoads];
      uint64_t to[kSegmentLoads];
#pragma unroll
      for (int k = 0; k < kSegmentLoads; ++k) {
        const uint32_t v = base + 32 * k + lane;
        uint32_t j = 0;
#pragma unroll
        for (int q = 0; q < kSegmentsPerStep - 1; ++q) j += v >= ends[q] ? 1 : 0;
        const uint64_t d = __shfl_sync(0xffffffffu, my_dst, j);
        const uint64_t s = __shfl_sync(0xffffffffu, my_src, j);
        to[k] = 0;
        if (v < total) {
          value[k] = LoadFunnel(s + 8ull * v);
          to[k] = d + 8ull * v;
        }
      }
#pragma unroll
      for (int k = 0; k < kSegmentLoads; ++k) {
        if (to[k] != 0) *reinterpret_cast<uint64_t*>(to[k]) = value[k];
      }
    }
    // Heads, then tails: lane 8 (j % 4) + b moves byte b of segment j's head (tail), four
    // segments per pass; both are < 8 bytes.
#pragma unroll
    for (int pass = 0; pass < 2 * kSegmentsPerStep / 4; ++pass) {
      const int j = (pass % (kSegmentsPerStep / 4)) * 4 + static_cast<int>(lane / 8);
      const bool tails = pass >= kSegmentsPerStep / 4;
      const uint32_t b = lane % 8;
      const uint64_t s_src = __shfl_sync(0xffffffffu, mine.src, j);
      const uint64_t s_dst = __shfl_sync(0xffffffffu, mine.dst, j);
      const uint32_t s_head = __shfl_sync(0xffffffffu, mine.head, j);
      const uint32_t s_words = __shfl_sync(0xffffffffu, mine.words, j);
      const uint32_t s_tail = __shfl_sync(0xffffffffu, mine.tail, j);
      const uint32_t n = tails ? s_tail : s_head;
      if (b < n) {
        const uint64_t off = tails ? s_head + 8ull * s_words + b : b;
        *reinterpret_cast<uint8_t*>(s_dst + off) = *reinterpret_cast<const uint8_t*>(s_src + off);
      }
    }
  }
}
static_assert(kSegmentsPerStep % 4 == 0 && kSegmentsPerStep <= 32, "heads/tails: 4 segments a pass");

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
    KvCopyPiecesKernel<<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end, piece_bytes);
    return cudaGetLastError();
  }
  switch (access_bytes) {
    case 16: KvCopyKernel<16><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end); break;
    case 8: KvCopyKernel<8><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end); break;
    case 4: KvCopyKernel<4><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end); break;
    case 2: KvCopyKernel<2><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end); break;
    case 1: KvCopyKernel<1><<<grid, block, 0, stream>>>(device_header, tile_begin, tile_end); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

int KvCopySegmentsLaunch(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                         int num_ctas, int threads, CUstream_st* stream) {
  if (tile_end <= tile_begin) return cudaSuccess;
  if (threads > kMaxThreads || threads <= 0 || threads % 32 != 0 || num_ctas <= 0) {
    return cudaErrorInvalidValue;
  }
  KvCopySegmentsKernel<<<num_ctas, threads, 0, stream>>>(device_header, tile_begin, tile_end);
  return cudaGetLastError();
}

int WarmUpKernels(CUstream_st* stream) {
  PlanHeader* header = nullptr;
  cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&header), sizeof(PlanHeader), stream);
  if (e != cudaSuccess) return e;
  // A zero header: no tiles, every kernel returns after reading it.
  e = cudaMemsetAsync(header, 0, sizeof(PlanHeader), stream);
  const dim3 grid(1), block(32);
  if (e == cudaSuccess) {
    KvCopyPiecesKernel<<<grid, block, 0, stream>>>(header, 0, 0, kMaxPieceBytes);
    KvCopySegmentsKernel<<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopyKernel<16><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopyKernel<8><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopyKernel<4><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopyKernel<2><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopyKernel<1><<<grid, block, 0, stream>>>(header, 0, 0);
    e = cudaGetLastError();
  }
  const cudaError_t freed = cudaFreeAsync(header, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return e;
  return freed != cudaSuccess ? freed : synced;
}

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
