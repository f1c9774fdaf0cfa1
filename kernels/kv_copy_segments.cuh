// The segment path's kernels (shared by kv_copy.cu, which instantiates the forms the daemon uses,
// and kv_copy_forms.cu, which instantiates the forms benchmarks compare; segment_math.h:
// SegmentForm). Device code, included by .cu files only; each includer gets its own copy.
#ifndef KVRAIL_KERNELS_KV_COPY_SEGMENTS_CUH_
#define KVRAIL_KERNELS_KV_COPY_SEGMENTS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/device_abi.h"
#include "kernels/gather_common.cuh"
#include "kernels/plan_math.h"
#include "kernels/segment_math.h"

namespace kvrail::kernels {
namespace {

namespace segments {
constexpr int kMaxThreads = 512;
}  // namespace segments
using gather::ItemPos;
using gather::LoadHeader;
using gather::SplitItem;

// The segment path (plan_math.h: SegmentAt; arithmetic in segment_math.h), for plans whose
// accesses are narrower than 8 bytes (odd vector sizes, odd offsets, padded strides) and for short
// unmerged chunks at 8- or 16-byte accesses (segment_math.h: TakesSegmentPath). Segments
// longer than kSegmentPieceBytes (whole blocks of a misaligned plan: 32 KiB and more) are cut
// into pieces of at most that (a 256 MiB plan of 32 KiB segments is 8,448 segments: 264 warp
// steps of 32, fewer than the warps of 32 CTAs; measured, such a plan ran at one rate from 32 to
// 132 CTAs). Each segment is cut at the 16-byte boundaries of its DESTINATION into "units" (a
// partial head, whole 16-byte bodies, a partial tail); a unit's bytes come from the (at most two)
// aligned 16-byte source blocks holding them, shifted by the source's misalignment relative to
// the destination (byte funnel shifts, Window16), and go out as one 16-byte store or, for a
// partial unit, the widest aligned stores its bytes allow (StorePartial). A destination byte is
// written only by the unit it belongs to; a source block is read only if it holds a byte of the
// segment. Three forms (DevicePlan::segment_form):
// - registers (6, KvCopySegmentsKernel): a warp takes 32 segments per step (one lookup per lane),
//   the step's units form one stream of which each lane moves 6 per round, all loads of a round
//   (two 16-byte global loads per unit) before its stores;
// - bulk-staged (100 + stages, KvCopySegmentsBulkKernel, the default): each segment's aligned
//   source span is ONE bulk copy (cp.async.bulk, the SM's TMA unit) into a per-warp ring of
//   shared-memory stages completing on an mbarrier; segments are packed back to back into a
//   stage while their spans fit, and `stages - 1` stages are in flight while the lanes turn the
//   oldest into 16-byte destination stores (two shared-memory reads and a funnel shift per unit).
//   So a warp keeps up to ~8-12 KiB of loads in flight (registers held none of it), and the
//   global latency is paid per stage, not per round of 6 units. Pieces contiguous on both sides
//   (token chunks of plans cut per token) merge into runs of up to kSegmentPieceBytes first
//   (MergeHead), and partial units go out in straight-line stores (ForEachPartialStore);
// - split registers (200 + ..., KvCopySegmentsSplitKernel, below): the register form with only
//   whole units in the stream and each segment's partial units stored by its own lane.
// Upload picks the form per plan (segment_math.h: SegmentFormFor): split registers (206) for
// short unmerged chunks, bulk-staged otherwise; on code compiled for a GPU older than sm_90 the
// bulk-staged form does not exist (its body traps) and the split form takes its plans
// (kernel_arch.h: SegmentFormOn).
constexpr int kDefaultUnitsPerLane = 6;
static_assert(static_cast<int>(SegmentForm::kRegisters) == kDefaultUnitsPerLane,
              "segment_math.h names this form");
constexpr int kBulkSegmentForm = 100;  // SegmentForm value kBulkSegmentForm + stages
constexpr int kDefaultBulkStages = 3;
// The default: one bulk copy per piece, 3 stages (docs/benchmarks.md: a variant
// filling several-piece stages with the lanes' cp.async copies was 5-20% slower wherever stages
// held several pieces, and is gone).
static_assert(static_cast<int>(SegmentForm::kBulk3) == kBulkSegmentForm + kDefaultBulkStages,
              "segment_math.h names this form");
// Shared memory the bulk form's ring may take per CTA (the H200 allows 227 KiB per block; the
// header and the mbarriers are static).
constexpr uint32_t kBulkRingBudget = 200 * 1024;

// Segment piece `item` of the launch: piece `item % splits` of segment `item / splits` (lanes
// with nothing to locate get an empty one).
__device__ __forceinline__ ChunkSpan LocateSegment(const PlanHeader& h, const uint32_t* src_blocks,
                                                   const uint32_t* dst_blocks, uint32_t tile_begin,
                                                   uint64_t item, uint64_t items, uint64_t per_tile,
                                                   const FastDivU32& div, uint32_t splits,
                                                   const FastDivU32& split_div) {
  if (item >= items) return ChunkSpan{0, 0, 0};
  const ItemPos pos = SplitItem(item, per_tile, div);
  const TileDesc t = TileAt(h, tile_begin + static_cast<uint32_t>(pos.tile));
  const ItemPos part = SplitItem(pos.index, splits, split_div);
  const ChunkSpan seg = SegmentAt(h, src_blocks, dst_blocks, t, part.tile);
  const uint64_t begin = part.index * kSegmentPieceBytes;
  if (begin >= seg.bytes) return ChunkSpan{0, 0, 0};
  const uint64_t left = seg.bytes - begin;
  return ChunkSpan{seg.src + begin, seg.dst + begin,
                   left < kSegmentPieceBytes ? left : kSegmentPieceBytes};
}

// The launch's segment pieces: `items` in all, `per_tile` per tile, `splits` per segment.
struct SegmentGrid {
  uint64_t items;
  uint64_t per_tile;
  FastDivU32 tile_div;
  uint32_t splits;
  FastDivU32 split_div;
};
__device__ __forceinline__ SegmentGrid MakeSegmentGrid(const PlanHeader& h, uint32_t tiles) {
  SegmentGrid g;
  // Pieces per segment: a segment is at most a chunk and at most a tile long.
  const uint64_t longest = h.chunk_bytes < h.tile_bytes ? h.chunk_bytes : h.tile_bytes;
  g.splits = static_cast<uint32_t>((longest + kSegmentPieceBytes - 1) / kSegmentPieceBytes);
  g.split_div = MakeFastDiv(g.splits);
  g.per_tile = SegmentsPerTile(h) * g.splits;
  g.tile_div =
      MakeFastDiv(g.per_tile <= kFastDivMaxDividend ? static_cast<uint32_t>(g.per_tile) : 1);
  g.items = static_cast<uint64_t>(tiles) * g.per_tile;
  return g;
}

__device__ __forceinline__ uint4 Window16(const uint4& a, const uint4& b, uint32_t r) {
  const Words4 w = kernels::Window16(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, r);
  return make_uint4(w.w[0], w.w[1], w.w[2], w.w[3]);
}

// Stores bytes [lo, hi) of `v` (hi <= 16) at block + lo (block 16-byte aligned), in the widest
// aligned stores those bytes allow (ForEachPartialStore: straight-line, no divergent loop).
__device__ __forceinline__ void StorePartial(uint64_t block, const uint4& v, uint32_t lo,
                                             uint32_t hi) {
  const uint64_t v0 = (static_cast<uint64_t>(v.y) << 32) | v.x;
  const uint64_t v1 = (static_cast<uint64_t>(v.w) << 32) | v.z;
  ForEachPartialStore(lo, hi, [&](uint32_t p, uint32_t size) {
    const uint64_t val =
        p == 0 ? v0 : (p < 8 ? (v0 >> (8 * p)) | (v1 << (64 - 8 * p)) : v1 >> (8 * (p - 8)));
    if (size == 8) {
      *reinterpret_cast<uint64_t*>(block + p) = val;
    } else if (size == 4) {
      *reinterpret_cast<uint32_t*>(block + p) = static_cast<uint32_t>(val);
    } else if (size == 2) {
      *reinterpret_cast<uint16_t*>(block + p) = static_cast<uint16_t>(val);
    } else {
      *reinterpret_cast<uint8_t*>(block + p) = static_cast<uint8_t>(val);
    }
  });
}

// One unit out: the whole 16-byte block, or bytes [lo, hi) of it.
__device__ __forceinline__ void StoreUnit(uint64_t block, const uint4& v, uint32_t lo,
                                          uint32_t hi) {
  if (lo == 0 && hi == 16) {
    *reinterpret_cast<uint4*>(block) = v;
  } else {
    StorePartial(block, v, lo, hi);
  }
}

// Inclusive prefix sum over the warp's lanes.
__device__ __forceinline__ uint32_t WarpInclusiveSum(uint32_t v, uint32_t lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= static_cast<uint32_t>(d)) v += up;
  }
  return v;
}

// The lane whose segment holds unit u: the number of lanes whose inclusive unit end is <= u
// (every lane calls).
__device__ __forceinline__ uint32_t SegmentOfUnit(uint32_t end, uint32_t u) {
  uint32_t j = 0;
#pragma unroll
  for (int step = 16; step > 0; step /= 2) {
    const uint32_t e = __shfl_sync(0xffffffffu, end, j + step - 1);
    if (e <= u) j += step;
  }
  return j;
}

// The register form (DevicePlan::segment_form 6; the default before the bulk form).
template <int kUnitsPerLane>
__global__ void __launch_bounds__(segments::kMaxThreads)
    KvCopySegmentsKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin,
                         uint32_t tile_end) {
  __shared__ PlanHeader h;
  LoadHeader(header, &h);
  if (h.num_tiles == 0) return;  // a gated job that ended (the CUDA engine disarmed it)
  const uint64_t src = h.src.base;
  const uint64_t dst = h.dst.base;
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint32_t lane = threadIdx.x & 31;
  const SegmentGrid g = MakeSegmentGrid(h, tile_end - tile_begin);
  const uint64_t items = g.items;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t warp = static_cast<uint64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const uint64_t stride = warps * 32;
  auto locate = [&](uint64_t item) {
    return LocateSegment(h, src_blocks, dst_blocks, tile_begin, item, items, g.per_tile, g.tile_div,
                         g.splits, g.split_div);
  };
  uint64_t first = warp * 32;
  ChunkSpan next = locate(first + lane);
  for (; first < items; first += stride) {
    // This lane's segment of the step: its units and where they go.
    const uint64_t d_addr = dst + next.dst;
    const uint64_t s_addr = src + next.src;
    const uint64_t len = next.bytes;
    const uint32_t units = SegmentUnits(d_addr, len);
    const uint32_t end = WarpInclusiveSum(units, lane);
    const uint32_t total = __shfl_sync(0xffffffffu, end, 31);
    // Unit u of this lane's segment (end - units <= u < end) is destination block
    // block0 + u (16-byte blocks); its source byte for destination byte x is x + delta.
    const uint64_t block0 = (d_addr >> 4) - (end - units);
    const uint32_t d_lo = static_cast<uint32_t>(d_addr);
    const uint32_t d_hi = static_cast<uint32_t>(d_addr + len);
    const uint64_t delta = s_addr - d_addr;
    // The next step's lookups go between the first round's loads and its stores (as the slab
    // path does): their block-table reads wait while the round's loads are in flight.
    bool located = false;
    for (uint32_t base = 0; base < total; base += 32 * kUnitsPerLane) {
      uint4 va[kUnitsPerLane], vb[kUnitsPerLane];
      uint64_t to[kUnitsPerLane];
      uint32_t meta[kUnitsPerLane];  // r | lo << 8 | hi << 16; hi == 0: nothing to store
      // A round inside one segment (long segments: nearly every round) finds it once.
      const uint32_t last =
          (base + 32 * kUnitsPerLane < total ? base + 32 * kUnitsPerLane : total) - 1;
      const uint32_t j_first = SegmentOfUnit(end, base);
      const bool one = j_first == SegmentOfUnit(end, last);  // warp-uniform
      uint64_t b0 = __shfl_sync(0xffffffffu, block0, j_first);
      uint32_t lo32 = __shfl_sync(0xffffffffu, d_lo, j_first);
      uint32_t hi32 = __shfl_sync(0xffffffffu, d_hi, j_first);
      uint64_t dl = __shfl_sync(0xffffffffu, delta, j_first);
#pragma unroll
      for (int k = 0; k < kUnitsPerLane; ++k) {
        const uint32_t u = base + 32 * k + lane;
        if (!one) {
          const uint32_t j = SegmentOfUnit(end, u);
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
          const UnitRange ur = UnitBytes(block, lo32, hi32);
          const uint64_t s = block + dl;  // source of the block's byte 0 (maybe not in the unit)
          const uint32_t r = static_cast<uint32_t>(s & 15);
          const uint4* aligned = reinterpret_cast<const uint4*>(s - r);
          if (r + ur.lo < 16) va[k] = aligned[0];
          if (r + ur.hi > 16) vb[k] = aligned[1];
          to[k] = block;
          meta[k] = r | (ur.lo << 8) | (ur.hi << 16);
        }
      }
      if (!located) {  // warp-uniform
        next = locate(first + stride + lane);
        located = true;
      }
#pragma unroll
      for (int k = 0; k < kUnitsPerLane; ++k) {
        const uint32_t hi = meta[k] >> 16;
        if (hi != 0) {
          StoreUnit(to[k], Window16(va[k], vb[k], meta[k] & 15), (meta[k] >> 8) & 0xff, hi);
        }
      }
    }
    if (!located) next = locate(first + stride + lane);  // a step without units
  }
}

// mbarrier and bulk-copy helpers of the bulk form (the same instructions as kv_digest.cu's
// staged kernel).
__device__ __forceinline__ uint32_t SharedAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void BarInit(uint32_t bar) {
  KVRAIL_BULK_ASM("mbarrier.init.shared.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void BarInitFence() {
  KVRAIL_BULK_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void ProxyFence() {
  KVRAIL_BULK_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// One arrival that also expects `bytes` of bulk copies on the barrier's current phase.
__device__ __forceinline__ void BarArriveExpect(uint32_t bar, uint32_t bytes) {
  [[maybe_unused]] uint64_t state;
  KVRAIL_BULK_ASM("mbarrier.arrive.expect_tx.shared.b64 %0, [%1], %2;\n"
                  : "=l"(state)
                  : "r"(bar), "r"(bytes)
                  : "memory");
}
__device__ __forceinline__ void BulkLoad(uint32_t to, uint64_t from, uint32_t bytes, uint32_t bar) {
  KVRAIL_BULK_ASM(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(to),
      "l"(from), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void BarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    KVRAIL_BULK_ASM(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}
// Per-lane 16-byte copy into shared memory (cp.async; `from` 16-byte aligned).
__device__ __forceinline__ void CpAsync16(uint32_t to, uint64_t from) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(from) : "memory");
}
// Waits for all of this thread's cp.async copies.
__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}
__device__ __forceinline__ uint4 LoadShared16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

// The split register form (DevicePlan::segment_form kSplitSegmentForm + 10 x (segments per lane
// - 1) + units per lane; arithmetic in segment_math.h: SplitSegment, UnitSegment). Like the
// register form, a warp takes 32 x kSegsPerLane segments per step (kSegsPerLane lookups per lane,
// the next step's issued during the first round), but each segment's WHOLE 16-byte destination
// units form the step's unit stream, moved with plain 16-byte stores, and its (at most two)
// partial units are stored by the lane that located it, loaded at the step's start: the per-unit
// loop has no partial-store path that a warp would execute whenever any of its lanes holds a
// partial unit. A unit's segment is one multiply-high when the step's segments have equal
// whole-unit counts (equal chunk lengths and destination alignments: nearly every step of a
// head-vector or token plan), else the shuffle search; its first block and source offset come
// from a per-warp table in shared memory (one 16-byte read instead of six shuffles). A unit whose
// source is 16-byte aligned relative to its destination reads one source block, otherwise the two
// holding its bytes (Window16). Two segments per lane (214, 216) double the bytes a step moves
// for the same chain of dependent latencies (lookup, loads, stores) that short segments are bound
// by, but measured slower on every layout (registers, 64 KiB of slots per CTA;
// docs/benchmarks.md): benchmark forms only. The partial units' source blocks go to shared memory
// by cp.async (no registers held while the first round and the next lookups run): dynamic shared
// memory of kPartialSlots x kSegsPerLane 16-byte slots per thread (SplitPartialSlotBytes).
constexpr int kSplitSegmentForm = 200;
static_assert(static_cast<int>(SegmentForm::kSplit6) == kSplitSegmentForm + 6,
              "segment_math.h names this form");
constexpr uint32_t kPartialSlots = 4;  // head: two source blocks, tail: two
__host__ __device__ constexpr uint32_t SplitPartialSlotBytes(uint32_t threads, int segs_per_lane) {
  return threads * kPartialSlots * static_cast<uint32_t>(segs_per_lane) * 16;
}
template <int kUnitsPerLane, int kSegsPerLane>
__global__ void __launch_bounds__(segments::kMaxThreads)
    KvCopySegmentsSplitKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin,
                              uint32_t tile_end) {
  constexpr int S = kSegsPerLane;
  __shared__ PlanHeader h;
  // Per warp, per segment of the step: {block of unit 0 of the step's stream (first whole block
  // minus the units before it), source address minus destination address}.
  __shared__ ulonglong2 params[segments::kMaxThreads / 32][32 * S];
  extern __shared__ __align__(16) uint8_t partial_slots[];
  LoadHeader(header, &h);
  if (h.num_tiles == 0) return;  // a gated job that ended (the CUDA engine disarmed it)
  const uint64_t src = h.src.base;
  const uint64_t dst = h.dst.base;
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint32_t lane = threadIdx.x & 31;
  ulonglong2* const table = params[threadIdx.x / 32];
  const SegmentGrid g = MakeSegmentGrid(h, tile_end - tile_begin);
  const uint64_t items = g.items;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t warp = static_cast<uint64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const uint64_t stride = warps * 32 * S;
  auto locate = [&](uint64_t item) {
    return LocateSegment(h, src_blocks, dst_blocks, tile_begin, item, items, g.per_tile, g.tile_div,
                         g.splits, g.split_div);
  };
  // This thread's partial-unit slots: slot i at slots + i * blockDim.x * 16 (consecutive lanes,
  // consecutive 16-byte words).
  const uint32_t slots = SharedAddr(partial_slots) + threadIdx.x * 16;
  const uint32_t slot_step = blockDim.x * 16;
  // A partial unit's (at most two) aligned source blocks into slots `i` and `i + 1`, each copied
  // only when it holds bytes of the unit.
  auto load_partial = [&](const PartialUnit& pu, uint64_t delta, uint32_t i) {
    if (pu.range.hi == 0) return;
    const uint64_t s = (pu.block << 4) + delta;
    const uint32_t r = static_cast<uint32_t>(s & 15);
    if (r + pu.range.lo < 16) CpAsync16(slots + i * slot_step, s - r);
    if (r + pu.range.hi > 16) CpAsync16(slots + (i + 1) * slot_step, s - r + 16);
  };
  auto store_partial = [&](const PartialUnit& pu, uint64_t delta, uint32_t i) {
    if (pu.range.hi == 0) return;
    const uint32_t r = static_cast<uint32_t>(((pu.block << 4) + delta) & 15);
    StorePartial(
        pu.block << 4,
        Window16(LoadShared16(slots + i * slot_step), LoadShared16(slots + (i + 1) * slot_step), r),
        pu.range.lo, pu.range.hi);
  };
  uint64_t first = warp * 32 * S;
  ChunkSpan next[S];
#pragma unroll
  for (int q = 0; q < S; ++q) next[q] = locate(first + 32 * q + lane);
  for (; first < items; first += stride) {
    SplitUnits su[S];
    uint64_t delta[S], d_at[S];
    uint32_t len[S];
    bool same = true;
    uint32_t full0 = 0;
#pragma unroll
    for (int q = 0; q < S; ++q) {
      const uint64_t d_addr = dst + next[q].dst;
      d_at[q] = d_addr;
      len[q] = static_cast<uint32_t>(next[q].bytes);
      delta[q] = src + next[q].src - d_addr;
      su[q] = SplitSegment(d_addr, next[q].bytes);
      if (q == 0) full0 = __shfl_sync(0xffffffffu, su[0].full, 0);
      same = same && su[q].full == full0;
    }
    const bool uniform = __all_sync(0xffffffffu, same);
    uint32_t end[S];
    uint32_t total = 0;
#pragma unroll
    for (int q = 0; q < S; ++q) {
      end[q] = uniform ? full0 * (32 * q + lane + 1) : total + WarpInclusiveSum(su[q].full, lane);
      total = __shfl_sync(0xffffffffu, end[q], 31);
    }
    const uint32_t magic = UnitMagic(full0);
    __syncwarp();  // every lane has read the previous step's table
#pragma unroll
    for (int q = 0; q < S; ++q) {
      table[32 * q + lane] = make_ulonglong2(su[q].first_full - (end[q] - su[q].full), delta[q]);
    }
    __syncwarp();
#pragma unroll
    for (int q = 0; q < S; ++q) {
      load_partial(su[q].head, delta[q], kPartialSlots * q);
      load_partial(su[q].tail, delta[q], kPartialSlots * q + 2);
    }
    // The partial units, stored after the first round's loads are issued (their copies were
    // issued before those); their units are found again from the segment (no registers held).
    auto store_partials = [&]() {
      CpAsyncWaitAll();
#pragma unroll
      for (int q = 0; q < S; ++q) {
        const SplitUnits again = SplitSegment(d_at[q], len[q]);
        store_partial(again.head, delta[q], kPartialSlots * q);
        store_partial(again.tail, delta[q], kPartialSlots * q + 2);
      }
    };
    auto locate_next = [&]() {
#pragma unroll
      for (int q = 0; q < S; ++q) next[q] = locate(first + stride + 32 * q + lane);
    };
    bool located = false;
    for (uint32_t base = 0; base < total; base += 32 * kUnitsPerLane) {
      uint4 va[kUnitsPerLane], vb[kUnitsPerLane];
      uint64_t to[kUnitsPerLane];
      uint32_t shift[kUnitsPerLane];  // source offset in its block; 16: nothing to store
#pragma unroll
      for (int k = 0; k < kUnitsPerLane; ++k) {
        const uint32_t u = base + 32 * k + lane;
        uint32_t j = 0;
        if (uniform) {
          j = u < total ? UnitSegment(u, full0, magic) : 0u;
        } else {
          // The search over each set of 32 (every lane takes part in each).
          uint32_t before = 0;
#pragma unroll
          for (int q = 0; q < S; ++q) {
            const uint32_t jq = SegmentOfUnit(end[q], u);
            if (u >= before) j = 32 * q + jq;
            before = __shfl_sync(0xffffffffu, end[q], 31);
          }
        }
        shift[k] = 16;
        to[k] = 0;
        va[k] = make_uint4(0, 0, 0, 0);
        vb[k] = make_uint4(0, 0, 0, 0);
        if (u < total) {
          const ulonglong2 p = table[j];
          to[k] = (p.x + u) << 4;
          const uint64_t s = to[k] + p.y;
          const uint32_t r = static_cast<uint32_t>(s & 15);
          const uint4* aligned = reinterpret_cast<const uint4*>(s - r);
          va[k] = aligned[0];
          if (r != 0) vb[k] = aligned[1];
          shift[k] = r;
        }
      }
      if (!located) {  // warp-uniform: the first round
        locate_next();
        located = true;
        store_partials();
      }
#pragma unroll
      for (int k = 0; k < kUnitsPerLane; ++k) {
        if (shift[k] != 16) *reinterpret_cast<uint4*>(to[k]) = Window16(va[k], vb[k], shift[k]);
      }
    }
    if (!located) {  // a step without whole units
      locate_next();
      store_partials();
    }
  }
}

// The bulk-staged form (see above). Dynamic shared memory: kStageRingHead + warps x kStages x
// stage_bytes + the rest of kStageRingPad (StageBytesFor). A warp's steps: its 32 segment pieces
// are located one per lane (the next step's lookups issued when a step starts, so they overlap
// the step's copies); their aligned source spans are packed into stages in order (a stage takes
// pieces while the prefix sum of their spans fits: StageFits); lane 0 arms the stage's mbarrier
// with the stage's bytes and each lane whose piece is in it issues that piece's bulk copy. The
// lanes then consume stages in order: lane t holds the stage's t-th piece (destination, length,
// stage position), the stage's units form one stream of which lane l takes units l, l + 32, ...
// (the piece of a unit found by a shuffle search unless the stage holds one piece).
template <int kStages>
__global__ void __launch_bounds__(segments::kMaxThreads)
    KvCopySegmentsBulkKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin,
                             uint32_t tile_end, uint32_t stage_bytes) {
  extern __shared__ __align__(16) uint8_t seg_ring[];
  __shared__ PlanHeader h;
  __shared__ __align__(8) uint64_t bars[segments::kMaxThreads / 32][kStages];
  LoadHeader(header, &h);
  if (h.num_tiles == 0) return;       // a gated job that ended (the CUDA engine disarmed it)
  if (!KVRAIL_BULK_COPIES) __trap();  // never launched there (kernel_arch.h: SegmentFormOn)
  const uint64_t src = h.src.base;
  const uint64_t dst = h.dst.base;
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warp_in_cta = threadIdx.x / 32;
  const SegmentGrid g = MakeSegmentGrid(h, tile_end - tile_begin);
  const uint64_t items = g.items;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t stride = warps * 32;
  uint64_t first = (static_cast<uint64_t>(blockIdx.x) * (blockDim.x / 32) + warp_in_cta) * 32;
  if (first >= items) return;  // warp-uniform; nothing of this warp's is in flight
  auto locate = [&](uint64_t item) {
    return LocateSegment(h, src_blocks, dst_blocks, tile_begin, item, items, g.per_tile, g.tile_div,
                         g.splits, g.split_div);
  };
  // Shared addresses: stage st of this warp, its mbarrier.
  const uint32_t ring = SharedAddr(seg_ring) + kStageRingHead +
                        warp_in_cta * static_cast<uint32_t>(kStages) * stage_bytes;
  const uint32_t bar0 = SharedAddr(&bars[warp_in_cta][0]);
  if (lane == 0) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) BarInit(bar0 + 8 * st);
    BarInitFence();
  }
  __syncwarp();

  // Producer state: the step's pieces (lane j: piece first + j), the first one not yet in a
  // stage (jn, warp-uniform), and the next step's pieces, already located.
  ChunkSpan cur = locate(first + lane);
  ChunkSpan ahead = locate(first + stride + lane);
  uint32_t c_span = 0, c_incl = 0;  // this lane's span bytes, inclusive prefix sum of spans
  auto prepare = [&]() {
    // Runs of pieces contiguous on both sides merge into one piece of at most
    // kSegmentPieceBytes, held by the run's first lane (the others get none): segment_math.h,
    // MergeHead.
    const uint64_t s = src + cur.src, d = dst + cur.dst;
    const uint32_t len = static_cast<uint32_t>(cur.bytes);
    const uint64_t prev_s_end = __shfl_up_sync(0xffffffffu, s + len, 1);
    const uint64_t prev_d_end = __shfl_up_sync(0xffffffffu, d + len, 1);
    const uint32_t prev_len = __shfl_up_sync(0xffffffffu, len, 1);
    const bool continues = lane > 0 && ContinuesPiece(prev_s_end, prev_d_end, prev_len, s, d, len);
    if (__any_sync(0xffffffffu, continues)) {
      uint32_t max_len = len;
#pragma unroll
      for (int o = 16; o > 0; o /= 2)
        max_len = max(max_len, __shfl_xor_sync(0xffffffffu, max_len, o));
      const uint32_t per_run = MergeRunPieces(max_len);
      const uint32_t upto = lane == 31 ? 0xffffffffu : (2u << lane) - 1;  // lanes <= this one
      const uint32_t starts = __ballot_sync(0xffffffffu, !continues);
      const uint32_t run_start = 31 - __clz(starts & upto);
      const uint32_t heads =
          __ballot_sync(0xffffffffu, MergeHead(continues, lane, run_start, per_run));
      const uint32_t later = heads & ~upto;
      const uint32_t next = later != 0 ? __ffs(later) - 1 : 32;  // the next run's first lane
      const uint32_t incl = WarpInclusiveSum(len, lane);
      const uint32_t run_end = __shfl_sync(0xffffffffu, incl, next - 1);
      cur.bytes = (heads >> lane) & 1 ? run_end - incl + len : 0;
    }
    c_span = SourceSpan(src + cur.src, cur.bytes).bytes;
    c_incl = WarpInclusiveSum(c_span, lane);
  };
  prepare();
  uint32_t jn = 0;
  bool exhausted = false;
  // Stage metadata, lane t: the stage's t-th piece (len 0 past the stage's pieces).
  struct StageMeta {
    uint64_t dst;  // destination address
    uint32_t len;  // bytes
    uint32_t pos;  // shared address of the destination's first byte's source byte
  };
  auto produce = [&](uint32_t fill, StageMeta & m) __attribute__((always_inline))->bool {
    uint32_t base = 0;
    for (;;) {
      if (exhausted) return false;
      const uint32_t total_bytes = __shfl_sync(0xffffffffu, c_incl, 31);
      const uint32_t before = __shfl_sync(0xffffffffu, c_incl, (jn + 31) & 31);
      base = jn == 0 ? 0u : before;
      if (jn < 32 && total_bytes > base) break;
      first += stride;  // this step is all in stages: the next one
      if (first >= items) {
        exhausted = true;
        return false;
      }
      cur = ahead;
      jn = 0;
      prepare();
      ahead = locate(first + stride + lane);
    }
    const uint32_t mask =
        __ballot_sync(0xffffffffu, lane >= jn && StageFits(c_incl, base, stage_bytes));
    const uint32_t jend = 32 - __clz(mask);
    const uint32_t stage_total = __shfl_sync(0xffffffffu, c_incl, jend - 1) - base;
    const uint32_t stage = ring + fill * stage_bytes;
    const uint32_t bar = bar0 + 8 * fill;
    __syncwarp();  // every lane has read the stage's previous contents
    ProxyFence();
    const uint32_t span_at = stage + (c_incl - c_span - base);
    const uint64_t s_addr = src + cur.src;
    const uint64_t d_addr = dst + cur.dst;
    const bool mine = lane >= jn && lane < jend && c_span != 0;
    if (lane == 0) BarArriveExpect(bar, stage_total);
    __syncwarp();  // the stage's bytes are expected before any of its copies can complete
    if (mine) BulkLoad(span_at, SourceSpan(s_addr, cur.bytes).begin, c_span, bar);
    // Where this lane's piece's destination byte d_addr lies in the stage.
    const uint32_t pos = StagePos(span_at, s_addr, d_addr, d_addr);
    const uint32_t from = (jn + lane) & 31;
    m.dst = __shfl_sync(0xffffffffu, d_addr, from);
    const uint32_t len = __shfl_sync(0xffffffffu, static_cast<uint32_t>(cur.bytes), from);
    m.len = lane < jend - jn ? len : 0u;
    m.pos = __shfl_sync(0xffffffffu, pos, from);
    jn = jend;
    return true;
  };
  // Turns stage `st` (landed) into destination stores.
  auto consume = [&](const StageMeta& m) __attribute__((always_inline)) {
    const uint64_t d_addr = m.dst;
    const uint32_t len = m.len;
    const uint32_t units = SegmentUnits(d_addr, len);
    const uint32_t end = WarpInclusiveSum(units, lane);
    const uint32_t total = __shfl_sync(0xffffffffu, end, 31);
    const bool single = __shfl_sync(0xffffffffu, end, 0) == total;  // one piece holds every unit
    // Unit u of this lane's piece is destination block block0 + u; its byte 0 is at stage
    // position q + 16 u (modulo 2^32).
    const uint64_t block0 = (d_addr >> 4) - (end - units);
    const uint32_t d_lo = static_cast<uint32_t>(d_addr);
    const uint32_t d_hi = static_cast<uint32_t>(d_addr + len);
    const uint32_t q = m.pos - d_lo + (static_cast<uint32_t>(block0) << 4);
    uint64_t b0 = __shfl_sync(0xffffffffu, block0, 0);
    uint32_t lo32 = __shfl_sync(0xffffffffu, d_lo, 0);
    uint32_t hi32 = __shfl_sync(0xffffffffu, d_hi, 0);
    uint32_t q32 = __shfl_sync(0xffffffffu, q, 0);
    constexpr int kPerLane = 2;
    for (uint32_t base = 0; base < total; base += 32 * kPerLane) {
      uint4 v[kPerLane];
      uint64_t to[kPerLane];
      uint32_t lo[kPerLane], hi[kPerLane];
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const uint32_t u = base + 32 * k + lane;
        if (!single) {
          const uint32_t j = SegmentOfUnit(end, u);
          b0 = __shfl_sync(0xffffffffu, block0, j);
          lo32 = __shfl_sync(0xffffffffu, d_lo, j);
          hi32 = __shfl_sync(0xffffffffu, d_hi, j);
          q32 = __shfl_sync(0xffffffffu, q, j);
        }
        hi[k] = 0;
        lo[k] = 0;
        to[k] = 0;
        v[k] = make_uint4(0, 0, 0, 0);
        if (u < total) {
          to[k] = (b0 + u) << 4;
          const UnitRange ur = UnitBytes(to[k], lo32, hi32);
          lo[k] = ur.lo;
          hi[k] = ur.hi;
          const uint32_t p = q32 + 16 * u;
          const uint32_t a = p & ~15u;
          v[k] = Window16(LoadShared16(a), LoadShared16(a + 16), p & 15);
        }
      }
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        if (hi[k] != 0) StoreUnit(to[k], v[k], lo[k], hi[k]);
      }
    }
  };

  // The stages in flight, oldest first (register arrays indexed only by constants; the shared
  // slots and mbarriers they use rotate at run time).
  StageMeta queue[kStages];
  bool live[kStages];
  uint32_t fill = 0, use = 0;  // the next slot to fill, the oldest slot in flight
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    live[k] = produce(fill, queue[k]);
    fill = fill + 1 == kStages ? 0 : fill + 1;
  }
  uint32_t phases = 0;  // bit st: the parity of slot st's next completion
  for (;;) {
    // Stages fill in order: once one is not live, none after it is, and every live one before
    // it has been consumed (its bulk copies waited for).
    if (!live[0]) return;
    live[kStages - 1] = produce(fill, queue[kStages - 1]);
    fill = fill + 1 == kStages ? 0 : fill + 1;
    BarWait(bar0 + 8 * use, (phases >> use) & 1);
    phases ^= 1u << use;
    consume(queue[0]);
    use = use + 1 == kStages ? 0 : use + 1;
#pragma unroll
    for (int k = 0; k < kStages - 1; ++k) {
      queue[k] = queue[k + 1];
      live[k] = live[k + 1];
    }
  }
}

template <int kStages>
int LaunchBulkSegments(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                       int num_ctas, int threads, CUstream_st* stream) {
  const uint32_t warps = static_cast<uint32_t>(threads) / 32;
  const uint32_t stage_bytes = StageBytesFor(kBulkRingBudget, warps, kStages);
  if (stage_bytes == 0) return cudaErrorInvalidValue;
  const size_t ring = kStageRingPad + static_cast<size_t>(warps) * kStages * stage_bytes;
  const cudaError_t e =
      cudaFuncSetAttribute(KvCopySegmentsBulkKernel<kStages>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(ring));
  if (e != cudaSuccess) return e;
  KvCopySegmentsBulkKernel<kStages>
      <<<num_ctas, threads, ring, stream>>>(device_header, tile_begin, tile_end, stage_bytes);
  return cudaGetLastError();
}

template <int kUnitsPerLane, int kSegsPerLane>
int LaunchSplitSegments(const PlanHeader* device_header, uint32_t tile_begin, uint32_t tile_end,
                        int num_ctas, int threads, CUstream_st* stream) {
  const uint32_t slots = SplitPartialSlotBytes(static_cast<uint32_t>(threads), kSegsPerLane);
  const cudaError_t e =
      cudaFuncSetAttribute(KvCopySegmentsSplitKernel<kUnitsPerLane, kSegsPerLane>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(slots));
  if (e != cudaSuccess) return e;
  KvCopySegmentsSplitKernel<kUnitsPerLane, kSegsPerLane>
      <<<num_ctas, threads, slots, stream>>>(device_header, tile_begin, tile_end);
  return cudaGetLastError();
}

}  // namespace
}  // namespace kvrail::kernels

#endif  // KVRAIL_KERNELS_KV_COPY_SEGMENTS_CUH_
