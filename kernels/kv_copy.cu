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
  if (h.num_tiles == 0) return;  // a gated job that ended (the CUDA engine disarmed it)
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

// The segment path (plan_math.h: SegmentAt), second design (issue 19 item 1): a warp takes 32
// consecutive segments per step, lane j locating segment j (one chunk lookup per segment; the
// next step's lookups are issued before this step's copies, so block-table and data latencies
// overlap). Each segment is cut at the 16-byte boundaries of its DESTINATION into "units" (a
// unit = the segment's bytes inside one aligned 16-byte destination block: a partial head, whole
// 16-byte bodies, a partial tail), and the units of the step's 32 segments form one stream of
// which every lane moves kUnitsPerLane per round, all loads of a round issued before any store.
// A unit's bytes come from the (at most two) aligned 16-byte source blocks holding them, shifted
// by the source's misalignment relative to the destination (byte funnel shifts in registers);
// whole units are one 16-byte store, partial ones (a segment's first and last) the widest
// aligned stores their bytes allow. So odd vector sizes, odd offsets and padded strides move in
// 16-byte loads and stores, with no separate byte passes for heads and tails. A source block is
// read only if it holds a byte of the unit, so no read leaves the pages the segment lies in; a
// destination byte is written only by the unit it belongs to.
// Units in flight per lane and round: 6 (the default) or 8 (more bytes in flight, but at 128
// registers per thread, all a 512-thread CTA allows, 8 spill the step's values: measured 2-7%
// slower at 32 CTAs, up to 17% at 132; docs/benchmarks.md, "issue 17/19 (G3)").
constexpr int kDefaultUnitsPerLane = 6;
// DevicePlan::segment_units value of the staged form (two rounds of 6 units per lane in flight).
constexpr int kStagedSegmentUnits = 12;

// Long segments (whole blocks of a plan whose base is misaligned: 32 KiB and more) are cut into
// pieces of at most kSegmentPieceBytes, so that a launch has enough of them for every warp (a
// 256 MiB plan of 32 KiB segments is 8,448 segments: 264 warp steps of 32, fewer than the
// warps of 32 CTAs; measured, such a plan ran at one rate from 32 to 132 CTAs).
constexpr uint32_t kSegmentPieceBytes = 4096;

// Segment piece `item` of the launch: piece `item % splits` of segment `item / splits` (lanes
// with nothing to locate get an empty one).
__device__ __forceinline__ ChunkSpan LocateSegment(const PlanHeader& h, const uint32_t* src_blocks,
                                                   const uint32_t* dst_blocks, uint32_t tile_begin,
                                                   uint64_t item, uint64_t items,
                                                   uint64_t per_tile, const FastDivU32& div,
                                                   uint32_t splits, const FastDivU32& split_div) {
  if (item >= items) return ChunkSpan{0, 0, 0};
  const ItemPos pos = SplitItem(item, per_tile, div);
  const TileDesc t = TileAt(h, tile_begin + static_cast<uint32_t>(pos.tile));
  const ItemPos part = SplitItem(pos.index, splits, split_div);
  const ChunkSpan seg = SegmentAt(h, src_blocks, dst_blocks, t, part.tile);
  const uint64_t begin = part.index * kSegmentPieceBytes;
  if (begin >= seg.bytes) return ChunkSpan{0, 0, 0};
  const uint64_t left = seg.bytes - begin;
  return ChunkSpan{seg.src + begin, seg.dst + begin, left < kSegmentPieceBytes ? left : kSegmentPieceBytes};
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Bytes [r, r + 16) of the 32 bytes (a, b) (r < 16), as uint4.
__device__ __forceinline__ uint4 Window16(const uint4& a, const uint4& b, uint32_t r) {
  uint32_t x0 = a.x, x1 = a.y, x2 = a.z, x3 = a.w, x4 = b.x, x5 = b.y, x6 = b.z, x7 = b.w;
  if (r & 8) {  // two words
    x0 = x2; x1 = x3; x2 = x4; x3 = x5; x4 = x6; x5 = x7;
  }
  if (r & 4) {  // one word
    x0 = x1; x1 = x2; x2 = x3; x3 = x4; x4 = x5;
  }
  const uint32_t s = 8 * (r & 3);
  return make_uint4(__funnelshift_r(x0, x1, s), __funnelshift_r(x1, x2, s),
                    __funnelshift_r(x2, x3, s), __funnelshift_r(x3, x4, s));
}

// Stores bytes [lo, hi) of `v` (hi <= 16) at block + lo (block 16-byte aligned), in the widest
// aligned stores those bytes allow.
__device__ __forceinline__ void StorePartial(uint64_t block, const uint4& v, uint32_t lo,
                                             uint32_t hi) {
  const uint64_t v0 = (static_cast<uint64_t>(v.y) << 32) | v.x;
  const uint64_t v1 = (static_cast<uint64_t>(v.w) << 32) | v.z;
  uint32_t p = lo;
  while (p < hi) {
    const uint64_t val =
        p == 0 ? v0 : (p < 8 ? (v0 >> (8 * p)) | (v1 << (64 - 8 * p)) : v1 >> (8 * (p - 8)));
    const uint32_t n = hi - p;
    if ((p & 7) == 0 && n >= 8) {
      *reinterpret_cast<uint64_t*>(block + p) = val;
      p += 8;
    } else if ((p & 3) == 0 && n >= 4) {
      *reinterpret_cast<uint32_t*>(block + p) = static_cast<uint32_t>(val);
      p += 4;
    } else if ((p & 1) == 0 && n >= 2) {
      *reinterpret_cast<uint16_t*>(block + p) = static_cast<uint16_t>(val);
      p += 2;
    } else {
      *reinterpret_cast<uint8_t*>(block + p) = static_cast<uint8_t>(val);
      p += 1;
    }
  }
}

// kStaged (a benchmark variant, DevicePlan::segment_units 12): the round's source blocks go into
// a per-lane ring in shared memory by cp.async (no registers held while in flight) and two rounds
// are in flight: round r + 1 is requested before round r is assembled and stored. Shared memory:
// warps x 2 x kUnitsPerLane x 32 lanes x 32 bytes (dynamic). Measured slower than the register
// form (25-28% of the aligned layout at 32 CTAs against 26-38%): per-lane 16-byte cp.async costs
// more than it saves here, as in the digest's staged kernel (kv_digest.cu).
template <int kUnitsPerLane, bool kStaged>
__global__ void __launch_bounds__(kMaxThreads)
    KvCopySegmentsKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin,
                         uint32_t tile_end) {
  extern __shared__ uint4 seg_ring[];
  __shared__ PlanHeader h;
  LoadHeader(header, &h);
  if (h.num_tiles == 0) return;  // a gated job that ended (the CUDA engine disarmed it)
  const uint64_t src = h.src.base;
  const uint64_t dst = h.dst.base;
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint32_t lane = threadIdx.x & 31;
  // Pieces per segment: a segment is at most a chunk and at most a tile long.
  const uint64_t longest = h.chunk_bytes < h.tile_bytes ? h.chunk_bytes : h.tile_bytes;
  const uint32_t splits = static_cast<uint32_t>((longest + kSegmentPieceBytes - 1) / kSegmentPieceBytes);
  const FastDivU32 split_div = MakeFastDiv(splits);
  const uint64_t per_tile = SegmentsPerTile(h) * splits;
  const FastDivU32 tile_div =
      MakeFastDiv(per_tile <= kFastDivMaxDividend ? static_cast<uint32_t>(per_tile) : 1);
  const uint64_t items = static_cast<uint64_t>(tile_end - tile_begin) * per_tile;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t warp = static_cast<uint64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const uint64_t stride = warps * 32;
  uint64_t first = warp * 32;
  ChunkSpan next = LocateSegment(h, src_blocks, dst_blocks, tile_begin, first + lane, items,
                                 per_tile, tile_div, splits, split_div);
  for (; first < items; first += stride) {
    // This lane's segment of the step: its units and where they go.
    const uint64_t d_addr = dst + next.dst;
    const uint64_t s_addr = src + next.src;
    const uint64_t len = next.bytes;
    const uint32_t units =
        len == 0 ? 0u : static_cast<uint32_t>(((d_addr + len + 15) >> 4) - (d_addr >> 4));
    uint32_t end = units;  // inclusive prefix sum of units over the lanes
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const uint32_t up = __shfl_up_sync(0xffffffffu, end, d);
      if (lane >= static_cast<uint32_t>(d)) end += up;
    }
    const uint32_t total = __shfl_sync(0xffffffffu, end, 31);
    // Unit u of this lane's segment (end - units <= u < end) is destination block
    // block0 + u (16-byte blocks); its source byte for destination byte x is x + delta.
    const uint64_t block0 = (d_addr >> 4) - (end - units);
    const uint32_t d_lo = static_cast<uint32_t>(d_addr);
    const uint32_t d_hi = static_cast<uint32_t>(d_addr + len);
    const uint64_t delta = s_addr - d_addr;
    // The segment holding unit u: the number of lanes whose end is <= u (every lane calls).
    auto segment_of = [&](uint32_t u) {
      uint32_t j = 0;
#pragma unroll
      for (int step = 16; step > 0; step /= 2) {
        const uint32_t e = __shfl_sync(0xffffffffu, end, j + step - 1);
        if (e <= u) j += step;
      }
      return j;
    };
    // The next step's lookups go between the first round's loads and its stores (as the slab
    // path does): their block-table reads wait while the round's loads are in flight.
    bool located = false;
    if constexpr (kStaged) {
      constexpr uint32_t kRound = 32 * kUnitsPerLane;
      // This lane's slots: [stage][k] -> 2 uint4 (the unit's two aligned source blocks).
      uint4* ring = seg_ring + (static_cast<size_t>(threadIdx.x / 32) * 2 * kUnitsPerLane * 32 + lane) * 2;
      uint64_t to[2][kUnitsPerLane];
      uint32_t meta[2][kUnitsPerLane];
      auto request = [&](uint32_t base, const int stg) {
        const uint32_t last = (base + kRound < total ? base + kRound : total) - 1;
        const uint32_t j_first = segment_of(base);
        const bool one = j_first == segment_of(last);  // warp-uniform
        uint64_t b0 = __shfl_sync(0xffffffffu, block0, j_first);
        uint32_t lo32 = __shfl_sync(0xffffffffu, d_lo, j_first);
        uint32_t hi32 = __shfl_sync(0xffffffffu, d_hi, j_first);
        uint64_t dl = __shfl_sync(0xffffffffu, delta, j_first);
#pragma unroll
        for (int k = 0; k < kUnitsPerLane; ++k) {
          const uint32_t u = base + 32 * k + lane;
          if (!one) {
            const uint32_t j = segment_of(u);
            b0 = __shfl_sync(0xffffffffu, block0, j);
            lo32 = __shfl_sync(0xffffffffu, d_lo, j);
            hi32 = __shfl_sync(0xffffffffu, d_hi, j);
            dl = __shfl_sync(0xffffffffu, delta, j);
          }
          meta[stg][k] = 0;
          to[stg][k] = 0;
          if (u < total) {
            const uint64_t block = (b0 + u) << 4;
            const int32_t lo_rel = static_cast<int32_t>(lo32 - static_cast<uint32_t>(block));
            const int32_t hi_rel = static_cast<int32_t>(hi32 - static_cast<uint32_t>(block));
            const uint32_t lo = lo_rel > 0 ? static_cast<uint32_t>(lo_rel) : 0u;
            const uint32_t hi = hi_rel < 16 ? static_cast<uint32_t>(hi_rel) : 16u;
            const uint64_t s = block + dl;
            const uint32_t r = static_cast<uint32_t>(s & 15);
            const uint4* aligned = reinterpret_cast<const uint4*>(s - r);
            uint4* slot = ring + (stg * kUnitsPerLane + k) * 64;
            if (r + lo < 16) CpAsync16(slot, aligned);
            if (r + hi > 16) CpAsync16(slot + 1, aligned + 1);
            to[stg][k] = block;
            meta[stg][k] = r | (lo << 8) | (hi << 16);
          }
        }
        CpAsyncCommit();
      };
      auto finish = [&](const int stg) {
        CpAsyncWait<1>();  // this lane's copies of the older round have landed
#pragma unroll
        for (int k = 0; k < kUnitsPerLane; ++k) {
          const uint32_t hi = meta[stg][k] >> 16;
          if (hi != 0) {
            const uint32_t lo = (meta[stg][k] >> 8) & 0xff;
            const uint4* slot = ring + (stg * kUnitsPerLane + k) * 64;
            const uint4 v = Window16(slot[0], slot[1], meta[stg][k] & 15);
            if (lo == 0 && hi == 16) {
              *reinterpret_cast<uint4*>(to[stg][k]) = v;
            } else {
              StorePartial(to[stg][k], v, lo, hi);
            }
          }
        }
      };
      if (total > 0) {
        request(0, 0);
        next = LocateSegment(h, src_blocks, dst_blocks, tile_begin, first + stride + lane, items,
                             per_tile, tile_div, splits, split_div);
        located = true;
        for (uint32_t base = 0;; base += 2 * kRound) {
          // Round `base` is in stage 0, round base + kRound goes to stage 1.
          if (base + kRound < total) {
            request(base + kRound, 1);
          } else {
            CpAsyncCommit();  // an empty group: wait_group counts rounds
          }
          finish(0);
          if (base + kRound >= total) break;
          if (base + 2 * kRound < total) {
            request(base + 2 * kRound, 0);
          } else {
            CpAsyncCommit();
          }
          finish(1);
          if (base + 2 * kRound >= total) break;
        }
      }
    } else {
      for (uint32_t base = 0; base < total; base += 32 * kUnitsPerLane) {
        uint4 va[kUnitsPerLane], vb[kUnitsPerLane];
        uint64_t to[kUnitsPerLane];
        uint32_t meta[kUnitsPerLane];  // r | lo << 8 | hi << 16; hi == 0: nothing to store
        // A round inside one segment (long segments: nearly every round) finds it once.
        const uint32_t last = (base + 32 * kUnitsPerLane < total ? base + 32 * kUnitsPerLane : total) - 1;
        const uint32_t j_first = segment_of(base);
        const bool one = j_first == segment_of(last);  // warp-uniform
        uint64_t b0 = __shfl_sync(0xffffffffu, block0, j_first);
        uint32_t lo32 = __shfl_sync(0xffffffffu, d_lo, j_first);
        uint32_t hi32 = __shfl_sync(0xffffffffu, d_hi, j_first);
        uint64_t dl = __shfl_sync(0xffffffffu, delta, j_first);
  #pragma unroll
        for (int k = 0; k < kUnitsPerLane; ++k) {
          const uint32_t u = base + 32 * k + lane;
          if (!one) {
            const uint32_t j = segment_of(u);
            b0 = __shfl_sync(0xffffffffu, block0, j);
            lo32 = __shfl_sync(0xffffffffu, d_lo, j);
            hi32 = __shfl_sync(0xffffffffu, d_hi, j);
            dl = __shfl_sync(0xffffffffu, delta, j);
          }
          meta[k] = 0;
          to[k] = 0;
          va[k] = make_uint4(0, 0, 0, 0);
          vb[k] = make_uint4(0, 0, 0, 0);
          if (u < total) {
            const uint64_t block = (b0 + u) << 4;
            const int32_t lo_rel = static_cast<int32_t>(lo32 - static_cast<uint32_t>(block));
            const int32_t hi_rel = static_cast<int32_t>(hi32 - static_cast<uint32_t>(block));
            const uint32_t lo = lo_rel > 0 ? static_cast<uint32_t>(lo_rel) : 0u;
            const uint32_t hi = hi_rel < 16 ? static_cast<uint32_t>(hi_rel) : 16u;
            const uint64_t s = block + dl;  // source of the block's byte 0 (maybe not in the unit)
            const uint32_t r = static_cast<uint32_t>(s & 15);
            const uint4* aligned = reinterpret_cast<const uint4*>(s - r);
            if (r + lo < 16) va[k] = aligned[0];
            if (r + hi > 16) vb[k] = aligned[1];
            to[k] = block;
            meta[k] = r | (lo << 8) | (hi << 16);
          }
        }
        if (!located) {  // warp-uniform
          next = LocateSegment(h, src_blocks, dst_blocks, tile_begin, first + stride + lane, items,
                               per_tile, tile_div, splits, split_div);
          located = true;
        }
  #pragma unroll
        for (int k = 0; k < kUnitsPerLane; ++k) {
          const uint32_t hi = meta[k] >> 16;
          if (hi != 0) {
            const uint32_t lo = (meta[k] >> 8) & 0xff;
            const uint4 v = Window16(va[k], vb[k], meta[k] & 15);
            if (lo == 0 && hi == 16) {
              *reinterpret_cast<uint4*>(to[k]) = v;
            } else {
              StorePartial(to[k], v, lo, hi);
            }
          }
        }
      }
    }
    if (!located) {  // a step without units
      next = LocateSegment(h, src_blocks, dst_blocks, tile_begin, first + stride + lane, items,
                           per_tile, tile_div, splits, split_div);
    }
  }
}

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
                         int num_ctas, int threads, int units_per_lane, CUstream_st* stream) {
  if (tile_end <= tile_begin) return cudaSuccess;
  if (threads > kMaxThreads || threads <= 0 || threads % 32 != 0 || num_ctas <= 0) {
    return cudaErrorInvalidValue;
  }
  switch (units_per_lane == 0 ? kDefaultUnitsPerLane : units_per_lane) {
    case 8:
      KvCopySegmentsKernel<8, false><<<num_ctas, threads, 0, stream>>>(device_header, tile_begin,
                                                                       tile_end);
      break;
    case 6:
      KvCopySegmentsKernel<6, false><<<num_ctas, threads, 0, stream>>>(device_header, tile_begin,
                                                                       tile_end);
      break;
    case kStagedSegmentUnits: {  // two rounds of 6 in flight, staged in shared memory
      const size_t ring = static_cast<size_t>(threads / 32) * 2 * 6 * 32 * 32;
      const cudaError_t e = cudaFuncSetAttribute(KvCopySegmentsKernel<6, true>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(ring));
      if (e != cudaSuccess) return e;
      KvCopySegmentsKernel<6, true><<<num_ctas, threads, ring, stream>>>(device_header, tile_begin,
                                                                         tile_end);
      break;
    }
    default:
      return cudaErrorInvalidValue;
  }
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
    KvCopySegmentsKernel<8, false><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopySegmentsKernel<6, false><<<grid, block, 0, stream>>>(header, 0, 0);
    KvCopySegmentsKernel<6, true><<<grid, block, 2 * 6 * 32 * 32, stream>>>(header, 0, 0);
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
