// Device helpers shared by the gather kernels (kv_copy.cu, kv_digest.cu): one copy of the access
// types, the plan-header load, the item split and the slab locator, so the digest's fused copy
// reads plans exactly as the plain copy does. Device-only, included by .cu files.
#ifndef KVRAIL_KERNELS_GATHER_COMMON_CUH_
#define KVRAIL_KERNELS_GATHER_COMMON_CUH_

#include <cstdint>

#include "kernels/device_abi.h"
#include "kernels/plan_math.h"

// Device code compiled for sm_90 or newer has bulk copies (cp.async.bulk) and transaction-count
// mbarriers (kernel_arch.h: kBulkCopyArch). In code for older GPUs the helpers that issue them
// trap instead: the kernels built on them are compiled there but never launched (kernel_arch.h:
// HasBulkCopies), and the other forms compile for sm_80.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define KVRAIL_BULK_COPIES 0
#define KVRAIL_BULK_ASM(...) __trap()
#else
#define KVRAIL_BULK_COPIES 1
#define KVRAIL_BULK_ASM(...) asm volatile(__VA_ARGS__)
#endif

namespace kvrail::kernels::gather {

// Loads kept in flight per thread: enough independent 16-byte loads to cover NVLink / HBM
// latency with few CTAs (measured: 8 CTAs x 512 threads x 8 loads ~ 300-350 GB/s on H200).
constexpr int kLoadsInFlight = 8;

template <int W>
struct Access;
template <>
struct Access<16> {
  using T = int4;
};
template <>
struct Access<8> {
  using T = int2;
};
template <>
struct Access<4> {
  using T = int;
};
template <>
struct Access<2> {
  using T = short;
};
template <>
struct Access<1> {
  using T = char;
};

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

// Addresses of one slab (kv_copy.cu: KvCopyKernel; kv_digest.cu: DigestSlabKernel): this
// thread's accesses, relative to the region bases, and where the slab lies.
struct SlabAddr {
  uint64_t from[kLoadsInFlight];
  uint64_t to[kLoadsInFlight];
  uint64_t begin;  // the slab's first byte in its tile's (layer, part) stream
  uint32_t tile;   // absolute tile index
  uint32_t layer;  // the tile's layer and part
  uint32_t part;
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
  a.tile = tile_begin + static_cast<uint32_t>(pos.tile);
  const TileDesc t = TileAt(h, a.tile);
  const uint64_t begin = t.byte_begin + pos.index * slab_bytes;
  a.begin = begin;
  a.layer = t.layer;
  a.part = t.part;
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
    start.offset =
        static_cast<uint32_t>(begin) - start.chunk * static_cast<uint32_t>(h.chunk_bytes);
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

}  // namespace kvrail::kernels::gather

#endif  // KVRAIL_KERNELS_GATHER_COMMON_CUH_
