// The digest kernels (kv_digest.h), shared by kv_digest.cu, which instantiates the modes the
// daemon launches (copy + hash source, hash source, hash destination), and kv_digest_forms.cu,
// which instantiates the benchmark modes as well (kv_digest_forms.h). Device code, included by .cu
// files only; each includer gets its own copy.
//
// The integrity digest on the GPU (kv_digest.h; the hash is kernels/digest.h): the fused gather
// of kv_copy.cu with the source hashed as it is copied (no second read of the source: on the
// warp path each piece is staged in shared memory by a bulk copy and hashed there, the slab path
// hashes the values it holds in registers), and hash-only passes over one side (the destination
// read back after landing; the source of a copy-engine batch). The kernels follow kv_copy.cu's
// two paths (warp pieces, 16-byte accesses; CTA slabs, 8- and 16-byte accesses) with the same
// address arithmetic
// (plan_math.h); plans with narrower accesses (odd vector sizes or offsets) take a word kernel
// that assembles each 8-byte word of the logical stream from its 1-, 2- or 4-byte accesses.
// Per-tile sums are added into tile_digests[tile] with one atomicAdd per warp and tile run (the
// warp and slab paths keep per-thread sums in registers while consecutive items stay in one
// tile; the word kernel per warp and item).
#ifndef KVRAIL_KERNELS_KV_DIGEST_KERNELS_CUH_
#define KVRAIL_KERNELS_KV_DIGEST_KERNELS_CUH_

#include <cuda_runtime.h>

#include "kernels/device_abi.h"
#include "kernels/digest.h"
#include "kernels/gather_common.cuh"
#include "kernels/kernel_arch.h"
#include "kernels/plan_math.h"

namespace kvrail::kernels {
namespace {

namespace dg = ::kvrail::kernels::digest;

using gather::kLoadsInFlight;
constexpr int kMaxThreads = 512;

// What a launch does (kv_digest_launch.h: DigestKernelMode values).
constexpr int kCopyHashSource = 1;
constexpr int kHashSource = 2;
constexpr int kHashDestination = 3;
constexpr int kCopyNoHash = 4;  // the fused kernels' copy without the hash (benchmark baseline)
// Benchmarks: kCopyHashSource on the warp path's register version (DigestPiecesKernel), which
// the staged version replaced.
constexpr int kCopyHashRegisters = 5;
// Benchmarks: the staged warp kernel's other ways of moving pieces (Staging below).
constexpr int kCopyHashCpAsync = 6;
constexpr int kCopyHashBulkLoad = 7;
constexpr int kCopyNoHashBulkLoad = 8;

using gather::Access;
using gather::ItemPos;
using gather::LoadHeader;
using gather::LocateSlab;
using gather::SlabAddr;
using gather::SplitItem;

// Sums `v` over the warp and adds it to *out from lane 0 (every lane of the warp must call).
__device__ __forceinline__ void WarpAdd(uint64_t v, uint64_t* out) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0 && v != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(out), static_cast<unsigned long long>(v));
  }
}

// The digest terms of one W-byte access (W = 8 or 16) at stream byte q (a multiple of W): its
// whole words.
template <int W>
__device__ __forceinline__ uint64_t AccessTerms(const typename Access<W>::T& v, uint64_t key) {
  const uint64_t* words = reinterpret_cast<const uint64_t*>(&v);
  uint64_t sum = 0;
#pragma unroll
  for (int j = 0; j < W / 8; ++j) sum += dg::Mix(words[j], key + j);
  return sum;
}

// AccessTerms with the first word's position key already known (k = PositionKey(key), and the
// access's keys do not carry out of their low 32 bits, so key + j has key k + j * kKeyMul).
template <int W>
__device__ __forceinline__ uint64_t AccessTermsKeyed(const typename Access<W>::T& v, uint32_t k) {
  const uint64_t* words = reinterpret_cast<const uint64_t*>(&v);
  uint64_t sum = 0;
#pragma unroll
  for (int j = 0; j < W / 8; ++j) sum += dg::MixKeyed(words[j], k + j * dg::kKeyMul);
  return sum;
}

// Whether keys [key, key + words) share their high 32 bits (then one PositionKey and additions
// give them all: AccessTermsKeyed).
__device__ __forceinline__ bool KeysStayLow(uint64_t key, uint32_t words) {
  return static_cast<uint32_t>(key) <= 0xffffffffu - words;
}

// The source or destination of a span, by mode.
template <int kMode>
__device__ __forceinline__ uint64_t ReadOffset(const ChunkSpan& s) {
  return kMode == kHashDestination ? s.dst : s.src;
}

// Warp path (kv_copy.cu: KvCopyPiecesKernel) with the digest, software-pipelined: a warp issues
// the loads of its next piece before it stores and hashes the current one, so the hashing runs
// while the next loads are in flight. Work distribution: each warp takes one CONTIGUOUS run of
// the launch's pieces (warp w: pieces [w * n, (w + 1) * n), n = ceil(pieces / warps)), not every
// (warps)-th piece as the plain kernel's grid stride does, so consecutive pieces of a warp stay
// in one tile (a 1 MiB tile is 256 pieces) at every CTA count: each lane keeps its partial sum in
// registers and the warp reduces it (shuffles + one atomic) once per tile it touches, not once
// per piece, and the warps of a tile no longer all add into its counter at the same time.
// Measured on one H200: docs/benchmarks.md.
struct PieceWork {
  int4 value[kLoadsInFlight];
  int4* to;
  uint64_t key0;     // key of the piece's first word
  uint32_t vectors;  // 16-byte accesses in the piece
  uint32_t tile;     // absolute tile index
};

template <int kMode>
__device__ __forceinline__ void IssuePiece(
    const PlanHeader& h, const uint8_t* __restrict__ read_base, uint8_t* __restrict__ dst,
    const uint32_t* __restrict__ src_blocks, const uint32_t* __restrict__ dst_blocks,
    uint32_t tile_begin, uint64_t item, uint64_t pieces_per_tile, const FastDivU32& tile_div,
    uint32_t piece_bytes, uint64_t wps, uint32_t lane, PieceWork& w) {
  const ItemPos pos = SplitItem(item, pieces_per_tile, tile_div);
  w.tile = tile_begin + static_cast<uint32_t>(pos.tile);
  const TileDesc t = TileAt(h, w.tile);
  const ChunkSpan span = PieceAt(h, src_blocks, dst_blocks, t, pos.index, piece_bytes);
  const int4* from = reinterpret_cast<const int4*>(read_base + ReadOffset<kMode>(span));
  w.to = reinterpret_cast<int4*>(dst + span.dst);
  w.vectors = static_cast<uint32_t>(span.bytes / 16);
  // Pieces start at multiples of piece_bytes in the tile.
  w.key0 = dg::WordKey(wps, static_cast<uint64_t>(t.layer) * h.num_parts + t.part,
                       t.byte_begin + pos.index * piece_bytes);
#pragma unroll
  for (int k = 0; k < kLoadsInFlight; ++k) {
    const uint32_t v = k * 32 + lane;
    if (v < w.vectors) w.value[k] = from[v];
  }
}

// Stores the piece (copy mode) and returns this lane's digest terms of it.
template <int kMode>
__device__ __forceinline__ uint64_t FinishPiece(const PieceWork& w, uint32_t lane) {
  if (kMode == kCopyHashSource || kMode == kCopyNoHash) {
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t v = k * 32 + lane;
      if (v < w.vectors) w.to[v] = w.value[k];
    }
  }
  uint64_t sum = 0;
  if (kMode == kCopyNoHash) return sum;
  if (KeysStayLow(w.key0, 4096 / 8)) {  // nearly always: one key computation per piece
    const uint32_t kl = dg::PositionKey(w.key0) + 2 * lane * dg::kKeyMul;
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t v = k * 32 + lane;
      if (v < w.vectors) sum += AccessTermsKeyed<16>(w.value[k], kl + 2 * (k * 32) * dg::kKeyMul);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t v = k * 32 + lane;
      if (v < w.vectors) sum += AccessTerms<16>(w.value[k], w.key0 + 2 * v);
    }
  }
  return sum;
}

template <int kMode>
__global__ void __launch_bounds__(kMaxThreads)
    DigestPiecesKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin,
                       uint32_t tile_end, uint32_t piece_bytes, uint64_t* tile_digests) {
  __shared__ PlanHeader h;
  LoadHeader(header, &h);
  const uint8_t* __restrict__ read_base =
      reinterpret_cast<const uint8_t*>(kMode == kHashDestination ? h.dst.base : h.src.base);
  uint8_t* __restrict__ dst = reinterpret_cast<uint8_t*>(h.dst.base);
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warps_per_cta = blockDim.x / 32;
  const uint64_t pieces_per_tile = h.tile_bytes / piece_bytes;
  const FastDivU32 tile_div = MakeFastDiv(
      pieces_per_tile <= kFastDivMaxDividend ? static_cast<uint32_t>(pieces_per_tile) : 1);
  const uint64_t items = static_cast<uint64_t>(tile_end - tile_begin) * pieces_per_tile;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * warps_per_cta;
  const uint64_t per_warp = (items + warps - 1) / warps;
  const uint64_t wps = dg::WordsPerStream(h.part_bytes);
  // This warp's run [item, end); item is the same for the whole warp, so every branch below is
  // warp-uniform (WarpAdd).
  uint64_t item = (static_cast<uint64_t>(blockIdx.x) * warps_per_cta + threadIdx.x / 32) * per_warp;
  if (item >= items) return;
  const uint64_t end = item + per_warp < items ? item + per_warp : items;
  PieceWork a, b;
  IssuePiece<kMode>(h, read_base, dst, src_blocks, dst_blocks, tile_begin, item, pieces_per_tile,
                    tile_div, piece_bytes, wps, lane, a);
  uint64_t acc = 0;
  // Two half-steps per turn with the buffers' roles swapped (no register copies of the loads).
  for (;;) {
    uint64_t next = item + 1;
    bool more = next < end;
    if (more) {
      IssuePiece<kMode>(h, read_base, dst, src_blocks, dst_blocks, tile_begin, next,
                        pieces_per_tile, tile_div, piece_bytes, wps, lane, b);
    }
    acc += FinishPiece<kMode>(a, lane);
    if (kMode != kCopyNoHash && (!more || b.tile != a.tile)) {
      WarpAdd(acc, tile_digests + a.tile);
      acc = 0;
    }
    if (!more) break;
    item = next;
    next = item + 1;
    more = next < end;
    if (more) {
      IssuePiece<kMode>(h, read_base, dst, src_blocks, dst_blocks, tile_begin, next,
                        pieces_per_tile, tile_div, piece_bytes, wps, lane, a);
    }
    acc += FinishPiece<kMode>(b, lane);
    if (kMode != kCopyNoHash && (!more || a.tile != b.tile)) {
      WarpAdd(acc, tile_digests + b.tile);
      acc = 0;
    }
    if (!more) break;
    item = next;
  }
}

// Warp path, staged through shared memory (the version the library launches): as
// DigestPiecesKernel (contiguous runs of pieces per warp, one reduction per tile touched), but
// each warp keeps a ring of kStages pieces in shared memory filled by cp.async (16-byte copies
// global -> shared that hold no registers while in flight): piece i + kStages - 1 is requested
// before piece i is stored and hashed, so kStages - 1 pieces (8 KiB at 4 KiB pieces) stay in
// flight per warp while it hashes, where the register version could hold only the one next
// piece (its two 8 x 16-byte buffers already fill the 128 registers a 512-thread CTA allows).
// Each lane reads back only the vectors it requested itself (cp.async.wait_group covers the
// thread's own copies), so no barrier is needed. Shared memory: warps x kStages x piece_bytes
// (dynamic; 192 KiB at 512 threads and 4 KiB pieces).
constexpr int kStages = 3;

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

// The bulk variant (kBulk): lane 0 requests a whole piece with one cp.async.bulk (the copy engine
// of the SM, TMA), completing on a per-stage mbarrier all lanes wait on.
__device__ __forceinline__ uint32_t SharedAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void BarInit(uint64_t* bar) {
  KVRAIL_BULK_ASM("mbarrier.init.shared.b64 [%0], 1;\n" ::"r"(SharedAddr(bar)) : "memory");
}
__device__ __forceinline__ void BarInitFence() {
  KVRAIL_BULK_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void ProxyFence() {
  KVRAIL_BULK_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Lane 0: piece bytes [from, from + bytes) into `stage`, completing `bar`'s phase (bytes 0: a plain
// arrival completes it).
__device__ __forceinline__ void BulkRequest(void* stage, const void* from, uint32_t bytes,
                                            uint64_t* bar) {
  [[maybe_unused]] uint64_t state;  // the arrival's token (unused: waits go by phase parity)
  if (bytes == 0) {
    KVRAIL_BULK_ASM("mbarrier.arrive.shared.b64 %0, [%1];\n"
                    : "=l"(state)
                    : "r"(SharedAddr(bar))
                    : "memory");
    return;
  }
  KVRAIL_BULK_ASM("mbarrier.arrive.expect_tx.shared.b64 %0, [%1], %2;\n"
                  : "=l"(state)
                  : "r"(SharedAddr(bar)), "r"(bytes)
                  : "memory");
  KVRAIL_BULK_ASM(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(SharedAddr(stage)),
      "l"(from), "r"(bytes), "r"(SharedAddr(bar))
      : "memory");
}
// Lane 0: bytes [ring, ring + bytes) to global `to` (one bulk store, its own bulk group).
__device__ __forceinline__ void BulkStore(void* to, const void* ring, uint32_t bytes) {
  KVRAIL_BULK_ASM("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(to),
                  "r"(SharedAddr(ring)), "r"(bytes)
                  : "memory");
  KVRAIL_BULK_ASM("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Lane 0: every bulk store it issued has read its shared memory (may be refilled) ...
__device__ __forceinline__ void BulkStoreWaitRead() {
  KVRAIL_BULK_ASM("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// ... or is complete.
__device__ __forceinline__ void BulkStoreWaitAll() {
  KVRAIL_BULK_ASM("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ void BarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    KVRAIL_BULK_ASM(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(SharedAddr(bar)), "r"(parity)
        : "memory");
  }
}

struct StagedPiece {
  int4* to;
  uint64_t key0;     // key of the piece's first word
  uint32_t vectors;  // 16-byte accesses in the piece
  uint32_t tile;     // absolute tile index
};

// Where piece `item` is (its block-table reads are issued here; the copies a turn later, so
// the table's latency overlaps a turn of work instead of stalling the warp before its copies).
template <int kMode>
__device__ __forceinline__ void LocateStaged(
    const PlanHeader& h, const uint8_t* __restrict__ read_base, uint8_t* __restrict__ dst,
    const uint32_t* __restrict__ src_blocks, const uint32_t* __restrict__ dst_blocks,
    uint32_t tile_begin, uint64_t item, uint64_t pieces_per_tile, const FastDivU32& tile_div,
    uint32_t piece_bytes, uint64_t wps, StagedPiece& w, const int4*& from) {
  const ItemPos pos = SplitItem(item, pieces_per_tile, tile_div);
  w.tile = tile_begin + static_cast<uint32_t>(pos.tile);
  const TileDesc t = TileAt(h, w.tile);
  const ChunkSpan span = PieceAt(h, src_blocks, dst_blocks, t, pos.index, piece_bytes);
  from = reinterpret_cast<const int4*>(read_base + ReadOffset<kMode>(span));
  w.to = reinterpret_cast<int4*>(dst + span.dst);
  w.vectors = static_cast<uint32_t>(span.bytes / 16);
  w.key0 = dg::WordKey(wps, static_cast<uint64_t>(t.layer) * h.num_parts + t.part,
                       t.byte_begin + pos.index * piece_bytes);
}

// Requests the piece's vectors (lane l: vectors l, l + 32, ...) into `stage`.
__device__ __forceinline__ void IssueStaged(const int4* from, uint32_t vectors, uint32_t lane,
                                            int4* stage) {
#pragma unroll
  for (int k = 0; k < kLoadsInFlight; ++k) {
    const uint32_t v = k * 32 + lane;
    if (v < vectors) CpAsync16(stage + v, from + v);
  }
}

template <int kMode>
__device__ __forceinline__ uint64_t FinishStaged(const StagedPiece& w, const int4* stage,
                                                 uint32_t lane) {
  int4 value[kLoadsInFlight];
#pragma unroll
  for (int k = 0; k < kLoadsInFlight; ++k) {
    const uint32_t v = k * 32 + lane;
    if (v < w.vectors) value[k] = stage[v];
  }
  if (kMode == kCopyHashSource || kMode == kCopyNoHash) {
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t v = k * 32 + lane;
      if (v < w.vectors) w.to[v] = value[k];
    }
  }
  uint64_t sum = 0;
  if (kMode == kCopyNoHash) return sum;
  if (KeysStayLow(w.key0, 4096 / 8)) {
    const uint32_t kl = dg::PositionKey(w.key0) + 2 * lane * dg::kKeyMul;
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t v = k * 32 + lane;
      if (v < w.vectors) sum += AccessTermsKeyed<16>(value[k], kl + 2 * (k * 32) * dg::kKeyMul);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t v = k * 32 + lane;
      if (v < w.vectors) sum += AccessTerms<16>(value[k], w.key0 + 2 * v);
    }
  }
  return sum;
}

// How the staged warp kernel moves a piece (kernel_arch.h: DigestStaging): per-lane 16-byte
// cp.async into the ring and stores from registers (kLaneCopies, what GPUs without bulk copies
// run); one bulk copy per piece into the ring (lane 0, mbarrier) and stores from registers
// (kBulkLoad); or bulk copies both ways (kBulkLoadStore, the library's choice where bulk copies
// exist: the ring is written back by one bulk store per piece and the lanes only read it to
// hash). Measured on one H200 (docs/benchmarks.md), copy + hash against the
// plain kernel at 8 / 16 / 32 / 132 CTAs: kBulkLoadStore -5.4/-1.2/+8.3/+1.6% (32 KiB blocks),
// kBulkLoad -7.6/-4.0/+4.6/-1.3%, kLaneCopies -16.4/-13.6/-4.7/-0.9%.
using Staging = DigestStaging;
constexpr Staging kDefaultStaging = Staging::kBulkLoadStore;

template <int kMode, Staging kHow>
__global__ void __launch_bounds__(kMaxThreads)
    DigestPiecesStagedKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin,
                             uint32_t tile_end, uint32_t piece_bytes, uint64_t* tile_digests) {
  extern __shared__ int4 ring[];
  __shared__ PlanHeader h;
  __shared__ uint64_t bars[kMaxThreads / 32][kStages];  // bulk: one mbarrier per warp and stage
  LoadHeader(header, &h);
  constexpr bool kBulk = kHow != Staging::kLaneCopies;
  if (kBulk && !KVRAIL_BULK_COPIES) __trap();  // never launched there (kernel_arch.h)
  constexpr bool kBulkStore =
      kHow == Staging::kBulkLoadStore && (kMode == kCopyHashSource || kMode == kCopyNoHash);
  const uint8_t* __restrict__ read_base =
      reinterpret_cast<const uint8_t*>(kMode == kHashDestination ? h.dst.base : h.src.base);
  uint8_t* __restrict__ dst = reinterpret_cast<uint8_t*>(h.dst.base);
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warps_per_cta = blockDim.x / 32;
  const uint64_t pieces_per_tile = h.tile_bytes / piece_bytes;
  const FastDivU32 tile_div = MakeFastDiv(
      pieces_per_tile <= kFastDivMaxDividend ? static_cast<uint32_t>(pieces_per_tile) : 1);
  const uint64_t items = static_cast<uint64_t>(tile_end - tile_begin) * pieces_per_tile;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * warps_per_cta;
  const uint64_t per_warp = (items + warps - 1) / warps;
  const uint64_t wps = dg::WordsPerStream(h.part_bytes);
  const uint32_t stage_vectors = piece_bytes / 16;
  int4* my_ring = ring + static_cast<size_t>(threadIdx.x / 32) * kStages * stage_vectors;
  // This warp's run [item, end), warp-uniform (WarpAdd).
  uint64_t item = (static_cast<uint64_t>(blockIdx.x) * warps_per_cta + threadIdx.x / 32) * per_warp;
  if (item >= items) return;
  const uint64_t end = item + per_warp < items ? item + per_warp : items;
  uint64_t* my_bars = bars[threadIdx.x / 32];
  uint32_t phases = 0;  // kBulk: bit st = the parity of stage st's next completion
  if (kBulk) {
    if (lane == 0) {
#pragma unroll
      for (int st = 0; st < kStages; ++st) BarInit(my_bars + st);
      BarInitFence();
    }
    __syncwarp();
  }
  StagedPiece m[kStages];
  // The next piece to request (`issued`), already located (`ahead`, `ahead_from`).
  uint64_t issued = item;
  StagedPiece ahead;
  const int4* ahead_from;
  LocateStaged<kMode>(h, read_base, dst, src_blocks, dst_blocks, tile_begin, issued,
                      pieces_per_tile, tile_div, piece_bytes, wps, ahead, ahead_from);
  // Requests piece `issued` into stage `fill` and locates the one after it.
  auto request = [&](int fill) {
    m[fill] = ahead;
    if (kBulk) {
      __syncwarp();  // every lane has read the stage's previous piece
      if (lane == 0) {
        if (kBulkStore) BulkStoreWaitRead();  // ... and so has its bulk store
        ProxyFence();
        BulkRequest(my_ring + fill * stage_vectors, ahead_from, ahead.vectors * 16, my_bars + fill);
      }
    } else {
      IssueStaged(ahead_from, ahead.vectors, lane, my_ring + fill * stage_vectors);
    }
    ++issued;
    if (issued < end) {
      LocateStaged<kMode>(h, read_base, dst, src_blocks, dst_blocks, tile_begin, issued,
                          pieces_per_tile, tile_div, piece_bytes, wps, ahead, ahead_from);
    }
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (issued < end) request(st);
    if (!kBulk) CpAsyncCommit();  // one group per stage, empty or not: wait_group counts stages
  }
  uint64_t acc = 0;
  for (;;) {
    // Piece `item` is in stage st; piece item + kStages - 1 goes into the stage freed last.
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      if (issued < end) request((st + kStages - 1) % kStages);
      if (kBulk) {
        BarWait(my_bars + st, (phases >> st) & 1);  // piece `item` has landed
        phases ^= 1u << st;
      } else {
        CpAsyncCommit();
        CpAsyncWait<kStages - 1>();  // this thread's copies of piece `item` have landed
      }
      if (kBulkStore) {
        if (lane == 0 && m[st].vectors != 0) {
          BulkStore(m[st].to, my_ring + st * stage_vectors, m[st].vectors * 16);
        }
        if (kMode != kCopyNoHash) {  // hash only: the bulk store copies
          acc += FinishStaged<kHashSource>(m[st], my_ring + st * stage_vectors, lane);
        }
      } else {
        acc += FinishStaged<kMode>(m[st], my_ring + st * stage_vectors, lane);
      }
      const bool more = item + 1 < end;
      if (kMode != kCopyNoHash && (!more || m[(st + 1) % kStages].tile != m[st].tile)) {
        WarpAdd(acc, tile_digests + m[st].tile);
        acc = 0;
      }
      if (!more) {
        if (!kBulk) CpAsyncWait<0>();
        if (kBulkStore && lane == 0) BulkStoreWaitAll();  // the ring must outlive its stores
        return;
      }
      ++item;
    }
  }
}

// Slab path (kv_copy.cu: KvCopyKernel) with the digest, for 8- and 16-byte accesses: the copy
// kernel's slab locator (gather_common.cuh: LocateSlab), and the digest key of the slab's first
// word from where it lies.
__device__ __forceinline__ uint64_t SlabKey(const PlanHeader& h, const SlabAddr& a, uint64_t wps) {
  return dg::WordKey(wps, static_cast<uint64_t>(a.layer) * h.num_parts + a.part, a.begin);
}

template <int kMode, int W>
__global__ void __launch_bounds__(kMaxThreads)
    DigestSlabKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin, uint32_t tile_end,
                     uint64_t* tile_digests) {
  static_assert(W == 8 || W == 16, "whole words per access");
  using T = typename Access<W>::T;
  __shared__ PlanHeader h;
  LoadHeader(header, &h);
  const uint8_t* __restrict__ src = reinterpret_cast<const uint8_t*>(h.src.base);
  uint8_t* __restrict__ dst = reinterpret_cast<uint8_t*>(h.dst.base);
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint32_t slab_bytes = blockDim.x * kLoadsInFlight * W;
  const uint64_t slabs_per_tile = (h.tile_bytes + slab_bytes - 1) / slab_bytes;
  const FastDivU32 slabs_div = MakeFastDiv(
      static_cast<uint32_t>(slabs_per_tile <= kFastDivMaxDividend ? slabs_per_tile : 1));
  const uint64_t items = static_cast<uint64_t>(tile_end - tile_begin) * slabs_per_tile;
  const uint64_t wps = dg::WordsPerStream(h.part_bytes);

  // This CTA's contiguous run of slabs [item, end) (as the warp path: one reduction per tile
  // the CTA touches, not per slab; the plain kernel strides by gridDim.x).
  const uint64_t per_cta = (items + gridDim.x - 1) / gridDim.x;
  uint64_t item = static_cast<uint64_t>(blockIdx.x) * per_cta;
  const uint64_t end = item + per_cta < items ? item + per_cta : items;
  SlabAddr a;
  uint64_t acc = 0;  // this thread's terms of the current tile (reduced when the tile changes)
  if (item < end) {
    LocateSlab<W>(h, src_blocks, dst_blocks, tile_begin, item, slabs_div, slabs_per_tile,
                  slab_bytes, a);
  }
  while (item < end) {
    T value[kLoadsInFlight];
    uint64_t to[kLoadsInFlight];
    const uint32_t len = a.len;
    const uint64_t key = SlabKey(h, a, wps);
    const uint32_t tile = a.tile;
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t off = (k * blockDim.x + threadIdx.x) * W;
      if (off < len) {
        value[k] = *reinterpret_cast<const T*>(kMode == kHashDestination ? dst + a.to[k]
                                                                         : src + a.from[k]);
      }
      to[k] = a.to[k];
    }
    const uint64_t next = item + 1;
    if (next < end) {
      LocateSlab<W>(h, src_blocks, dst_blocks, tile_begin, next, slabs_div, slabs_per_tile,
                    slab_bytes, a);
    }
    uint64_t sum = 0;
    const bool low = KeysStayLow(key, kMaxThreads * kLoadsInFlight * 2);  // 64 KiB slabs at most
    const uint32_t k0 = dg::PositionKey(key);
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t off = (k * blockDim.x + threadIdx.x) * W;
      if (off < len) {
        if (kMode == kCopyHashSource || kMode == kCopyNoHash) {
          *reinterpret_cast<T*>(dst + to[k]) = value[k];
        }
        if (kMode != kCopyNoHash) {
          sum += low ? AccessTermsKeyed<W>(value[k], k0 + (off / 8) * dg::kKeyMul)
                     : AccessTerms<W>(value[k], key + off / 8);
        }
      }
    }
    acc += sum;
    // next (so the branch) is the same for the whole CTA; a.tile is next's tile.
    if (kMode != kCopyNoHash && (next >= end || a.tile != tile)) {
      WarpAdd(acc, tile_digests + tile);
      acc = 0;
    }
    item = next;
  }
}

// Narrow accesses (W = 1, 2, 4): each thread builds whole 8-byte words of the logical stream from
// the accesses inside them (each located through its own chunk), so words that straddle head
// vectors or chunk boundaries hash as the definition says. Item j of tile t is the word holding
// stream byte 8 * (t.byte_begin / 8 + j), clipped to the tile.
template <int kMode, int W>
__global__ void __launch_bounds__(kMaxThreads)
    DigestWordsKernel(const PlanHeader* __restrict__ header, uint32_t tile_begin, uint32_t tile_end,
                      uint64_t* tile_digests) {
  using T = typename Access<W>::T;
  __shared__ PlanHeader h;
  LoadHeader(header, &h);
  const uint8_t* __restrict__ src = reinterpret_cast<const uint8_t*>(h.src.base);
  uint8_t* __restrict__ dst = reinterpret_cast<uint8_t*>(h.dst.base);
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const uint64_t words_per_tile = h.tile_bytes / 8 + 2;  // a clipped word at either end
  const FastDivU32 div = MakeFastDiv(
      words_per_tile <= kFastDivMaxDividend ? static_cast<uint32_t>(words_per_tile) : 1);
  const uint64_t items = static_cast<uint64_t>(tile_end - tile_begin) * words_per_tile;
  const uint64_t wps = dg::WordsPerStream(h.part_bytes);
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  // Whole warps iterate together (WarpAdd needs every lane).
  const uint64_t rounded = (items + 31) / 32 * 32;
  for (uint64_t item = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < rounded;
       item += step) {
    uint64_t term = 0;
    uint32_t tile = 0xffffffffu;
    if (item < items) {
      const ItemPos pos = SplitItem(item, words_per_tile, div);
      tile = tile_begin + static_cast<uint32_t>(pos.tile);
      const TileDesc t = TileAt(h, tile);
      const uint64_t word_begin = (t.byte_begin / 8 + pos.index) * 8;
      const uint64_t lo = word_begin > t.byte_begin ? word_begin : t.byte_begin;
      const uint64_t hi = word_begin + 8 < t.byte_end ? word_begin + 8 : t.byte_end;
      if (lo < hi) {
        const LayerSpan layer = LayerAt(h, t.layer);
        uint64_t w = 0;
        for (uint64_t q = lo; q < hi; q += W) {
          uint64_t from, to;
          if (static_cast<ChunkKind>(h.chunk_kind) == ChunkKind::kBytes) {
            from = h.src.origin + q;
            to = h.dst.origin + q;
          } else {
            const uint64_t c = q / h.chunk_bytes;
            const ChunkSpan span =
                ChunkAtInLayer(h, src_blocks, dst_blocks, layer, t.part, static_cast<uint32_t>(c));
            from = span.src + (q - c * h.chunk_bytes);
            to = span.dst + (q - c * h.chunk_bytes);
          }
          const T v =
              *reinterpret_cast<const T*>(kMode == kHashDestination ? dst + to : src + from);
          if (kMode == kCopyHashSource) *reinterpret_cast<T*>(dst + to) = v;
          uint64_t bits = 0;
          for (int j = 0; j < W; ++j)
            bits |= static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(&v)[j]) << (8 * j);
          w |= bits << (8 * (q % 8));
        }
        term = dg::Mix(
            w, dg::WordKey(wps, static_cast<uint64_t>(t.layer) * h.num_parts + t.part, word_begin));
      }
    }
    // One atomic per warp when the warp's words share a tile (nearly always), else per lane.
    const uint32_t lane0_tile = __shfl_sync(0xffffffffu, tile, 0);
    if (__all_sync(0xffffffffu, tile == lane0_tile || tile == 0xffffffffu) &&
        lane0_tile != 0xffffffffu) {
      WarpAdd(term, tile_digests + lane0_tile);
    } else if (tile != 0xffffffffu && term != 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(tile_digests + tile),
                static_cast<unsigned long long>(term));
    }
  }
}

// Launches the staged warp kernel with `ring` bytes of dynamic shared memory, or the register
// version where the GPU has less shared memory per CTA than the ring (192 KiB at 512 threads
// and 4 KiB pieces: H100/H200 allow 227 KiB, an A100 163, an L40 99).
template <int kStagedMode, Staging kHow>
int LaunchStaged(const PlanHeader* header, uint32_t tile_begin, uint32_t tile_end, int num_ctas,
                 int threads, uint32_t piece_bytes, uint64_t* digests, cudaStream_t stream) {
  const size_t ring = static_cast<size_t>(threads / 32) * kStages * piece_bytes;
  const cudaError_t e =
      cudaFuncSetAttribute(DigestPiecesStagedKernel<kStagedMode, kHow>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(ring));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    DigestPiecesKernel<kStagedMode>
        <<<num_ctas, threads, 0, stream>>>(header, tile_begin, tile_end, piece_bytes, digests);
    return cudaGetLastError();
  }
  DigestPiecesStagedKernel<kStagedMode, kHow>
      <<<num_ctas, threads, ring, stream>>>(header, tile_begin, tile_end, piece_bytes, digests);
  return cudaGetLastError();
}

// `staging`: how the warp path stages pieces in the modes the daemon launches (kernel_arch.h:
// DigestStagingOn; kBulkLoadStore or kLaneCopies); the benchmark modes fix their own and refuse
// (cudaErrorNotSupported) a bulk staging when `staging` says bulk copies do not exist.
template <int kMode>
int LaunchMode(const PlanHeader* header, uint32_t tile_begin, uint32_t tile_end, int num_ctas,
               int threads, uint32_t access_bytes, uint32_t piece_bytes, uint64_t* digests,
               Staging staging, cudaStream_t stream) {
  const dim3 grid(num_ctas), block(threads);
  if (piece_bytes != 0) {
    if (access_bytes != 16 || piece_bytes > 4096 || piece_bytes % 16 != 0) {
      return cudaErrorInvalidValue;
    }
    if (kMode == kCopyHashRegisters) {
      DigestPiecesKernel<kCopyHashSource>
          <<<grid, block, 0, stream>>>(header, tile_begin, tile_end, piece_bytes, digests);
      return cudaGetLastError();
    }
    constexpr Staging kHow = kMode == kCopyHashCpAsync ? Staging::kLaneCopies
                             : kMode == kCopyHashBulkLoad || kMode == kCopyNoHashBulkLoad
                                 ? Staging::kBulkLoad
                                 : kDefaultStaging;
    constexpr int kStagedMode =
        kMode == kCopyHashRegisters || kMode == kCopyHashCpAsync || kMode == kCopyHashBulkLoad
            ? kCopyHashSource
        : kMode == kCopyNoHashBulkLoad ? kCopyNoHash
                                       : kMode;
    if (staging == Staging::kLaneCopies) {
      if constexpr (kHow == Staging::kBulkLoad) {
        return cudaErrorNotSupported;
      } else {
        return LaunchStaged<kStagedMode, Staging::kLaneCopies>(
            header, tile_begin, tile_end, num_ctas, threads, piece_bytes, digests, stream);
      }
    }
    return LaunchStaged<kStagedMode, kHow>(header, tile_begin, tile_end, num_ctas, threads,
                                           piece_bytes, digests, stream);
  }
  if constexpr (kMode == kCopyHashRegisters || kMode == kCopyHashCpAsync ||
                kMode == kCopyHashBulkLoad || kMode == kCopyNoHashBulkLoad) {
    return cudaErrorInvalidValue;  // benchmark variants of the warp path only
  } else {
    if (kMode == kCopyNoHash && access_bytes < 8) return cudaErrorInvalidValue;
    switch (access_bytes) {
      case 16:
        DigestSlabKernel<kMode, 16>
            <<<grid, block, 0, stream>>>(header, tile_begin, tile_end, digests);
        break;
      case 8:
        DigestSlabKernel<kMode, 8>
            <<<grid, block, 0, stream>>>(header, tile_begin, tile_end, digests);
        break;
      case 4:
        DigestWordsKernel<kMode, 4>
            <<<grid, block, 0, stream>>>(header, tile_begin, tile_end, digests);
        break;
      case 2:
        DigestWordsKernel<kMode, 2>
            <<<grid, block, 0, stream>>>(header, tile_begin, tile_end, digests);
        break;
      case 1:
        DigestWordsKernel<kMode, 1>
            <<<grid, block, 0, stream>>>(header, tile_begin, tile_end, digests);
        break;
      default:
        return cudaErrorInvalidValue;
    }
  }
  return cudaGetLastError();
}

}  // namespace
}  // namespace kvrail::kernels

#endif  // KVRAIL_KERNELS_KV_DIGEST_KERNELS_CUH_
