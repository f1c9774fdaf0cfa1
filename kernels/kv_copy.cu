// The fused gather/scatter kernel (see kv_copy.h) and the nvcc-side entry points.
#include <cuda_runtime.h>

#include "kernels/device_abi.h"
#include "kernels/kv_copy_launch.h"
#include "kernels/plan_math.h"

namespace kvrail::kernels {
namespace {

// Loads kept in flight per thread: enough independent 16-byte loads to cover NVLink / HBM
// latency with few CTAs (measured: 8 CTAs x 512 threads x 8 loads ~ 300-350 GB/s on H200).
constexpr int kLoadsInFlight = 8;
constexpr int kMaxThreads = 512;

template <int W> struct Access;
template <> struct Access<16> { using T = int4; };
template <> struct Access<8> { using T = int2; };
template <> struct Access<4> { using T = int; };
template <> struct Access<2> { using T = short; };
template <> struct Access<1> { using T = char; };

// Copies the plan header into the CTA's shared memory (every thread reads it all the time) and
// waits for the whole CTA.
__device__ __forceinline__ void LoadHeader(const PlanHeader* __restrict__ from_header,
                                           PlanHeader* to_header) {
  const uint64_t* from = reinterpret_cast<const uint64_t*>(from_header);
  uint64_t* to = reinterpret_cast<uint64_t*>(to_header);
  for (int k = threadIdx.x; k < static_cast<int>(sizeof(PlanHeader) / 8); k += blockDim.x) {
    to[k] = from[k];
  }
  __syncthreads();
}

// Item `item` of a launch (a slab or a piece), `per_tile` items per tile: which tile of the
// launch and which item inside it. `div` divides by per_tile (MakeFastDiv), used whenever both
// fit the fast division.
struct ItemPos {
  uint64_t tile;
  uint64_t index;
};
__device__ __forceinline__ ItemPos SplitItem(uint64_t item, uint64_t per_tile,
                                             const FastDivU32& div) {
  if (item <= kFastDivMaxDividend && per_tile <= kFastDivMaxDividend) {
    const uint64_t tile = FastDiv(div, static_cast<uint32_t>(item));
    return ItemPos{tile, item - tile * per_tile};
  }
  return ItemPos{item / per_tile, item % per_tile};
}

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
// segments at a time, lane j < kSegmentsPerStep locating segment j (one chunk lookup per segment,
// shared through shuffles). Every segment is cut at 8-byte boundaries of its DESTINATION: a head
// (< 8 bytes) and a tail (< 8 bytes) moved bytewise, and a body of aligned 8-byte stores whose
// bytes come from the source's aligned 8-byte words funnel-shifted by the source's misalignment
// (two loads, one mostly from L1). So odd vector sizes, odd offsets and padded strides move in
// 8-byte accesses, not at the plan's narrowest width. Each aligned word read holds at least one
// byte of the segment, so no read leaves the pages the segment lies in. The bodies of the step's
// segments are one stream of words, of which each lane keeps kSegmentLoads in flight.
constexpr int kSegmentsPerStep = 4;
constexpr int kSegmentLoads = 8;

struct SegmentPlan {
  uint64_t src, dst;  // segment start (region offsets resolved to addresses)
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

// Body word w of segment s: its value, from the source's aligned words.
__device__ __forceinline__ uint64_t LoadBodyWord(const SegmentPlan& s, uint32_t w) {
  const uint64_t at = s.src + s.head + 8ull * w;
  const uint32_t r = static_cast<uint32_t>(at & 7);
  const uint64_t* aligned = reinterpret_cast<const uint64_t*>(at - r);
  const uint64_t lo = aligned[0];
  if (r == 0) return lo;
  const uint64_t hi = aligned[1];
  return (lo >> (8 * r)) | (hi << (64 - 8 * r));
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
  for (uint64_t first = warp * kSegmentsPerStep; first < items;
       first += warps * kSegmentsPerStep) {
    // Lane j < kSegmentsPerStep locates segment first + j.
    uint64_t my_src = 0, my_dst = 0, my_len = 0;
    if (lane < kSegmentsPerStep && first + lane < items) {
      const ItemPos pos = SplitItem(first + lane, per_tile, tile_div);
      const TileDesc t = TileAt(h, tile_begin + static_cast<uint32_t>(pos.tile));
      const ChunkSpan span = SegmentAt(h, src_blocks, dst_blocks, t, pos.index);
      my_src = src + span.src;
      my_dst = dst + span.dst;
      my_len = span.bytes;
    }
    SegmentPlan seg[kSegmentsPerStep];
    uint32_t ends[kSegmentsPerStep];  // running sum of body words
    uint32_t total = 0;
#pragma unroll
    for (int j = 0; j < kSegmentsPerStep; ++j) {
      seg[j] = PlanSegment(__shfl_sync(0xffffffffu, my_src, j), __shfl_sync(0xffffffffu, my_dst, j),
                           __shfl_sync(0xffffffffu, my_len, j));
      total += seg[j].words;
      ends[j] = total;
    }
    // Bodies: one stream of `total` words; each lane keeps kSegmentLoads loads in flight.
    for (uint32_t base = lane; base < total; base += 32 * kSegmentLoads) {
      uint64_t value[kSegmentLoads];
      uint64_t to[kSegmentLoads];
#pragma unroll
      for (int k = 0; k < kSegmentLoads; ++k) {
        const uint32_t v = base + 32 * k;
        to[k] = 0;
        if (v < total) {
          int j = 0;
#pragma unroll
          for (int q = 0; q < kSegmentsPerStep - 1; ++q) j += v >= ends[q] ? 1 : 0;
          const uint32_t w = v - (j == 0 ? 0 : ends[j - 1]);
          // Indexing seg[j] by a run-time j would put seg in local memory: select instead.
          SegmentPlan s = seg[0];
#pragma unroll
          for (int q = 1; q < kSegmentsPerStep; ++q) {
            if (j == q) s = seg[q];
          }
          value[k] = LoadBodyWord(s, w);
          to[k] = s.dst + s.head + 8ull * w;
        }
      }
#pragma unroll
      for (int k = 0; k < kSegmentLoads; ++k) {
        if (to[k] != 0) *reinterpret_cast<uint64_t*>(to[k]) = value[k];
      }
    }
    // Heads, then tails: lane 8j + b moves byte b of segment j's head (tail); both are < 8 bytes.
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int j = lane / 8;
      const uint32_t b = lane % 8;
      SegmentPlan s = seg[0];
#pragma unroll
      for (int q = 1; q < kSegmentsPerStep; ++q) {
        if (j == q) s = seg[q];
      }
      const uint32_t n = pass == 0 ? s.head : s.tail;
      if (b < n) {
        const uint64_t off = pass == 0 ? b : s.head + 8ull * s.words + b;
        *reinterpret_cast<uint8_t*>(s.dst + off) = *reinterpret_cast<const uint8_t*>(s.src + off);
      }
    }
  }
}
static_assert(kSegmentsPerStep * 8 == 32, "heads and tails: one lane per byte of 4 segments");

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
