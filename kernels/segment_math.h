// Arithmetic of the kernel's segment path (kv_copy.cu), shared by the kernel and
// its host test (segment_math_test.cc, which replays the bulk-staged form byte for byte on the
// CPU). Where segments come from is plan_math.h (SegmentAt); this file only says how one segment
// [s, s + len) -> [d, d + len) moves in 16-byte units:
// - its DESTINATION is cut at 16-byte boundaries into units (a partial head, whole bodies, a
//   partial tail): SegmentUnits, UnitBytes;
// - the bulk-staged form copies the segment's aligned SOURCE span (the 16-byte blocks holding its
//   bytes: SourceSpan) into a shared-memory stage, several segments packed back to back per stage
//   (StageFits), and each unit's 16 bytes are then read from the stage at a byte position
//   (StagePos) that is generally not 16-byte aligned: two aligned 16-byte reads and a funnel shift
//   (Window16).
#pragma once

#include <stdint.h>

#include "kernels/plan_math.h"

namespace kvrail::kernels {

// Segments longer than this are cut into pieces of at most this many bytes (kv_copy.cu:
// LocateSegment), so that a piece's source span always fits one stage.
inline constexpr uint32_t kSegmentPieceBytes = 4096;
// The largest aligned source span of a piece: kSegmentPieceBytes + up to 15 bytes before and
// after, rounded to 16.
inline constexpr uint32_t kMaxSegmentSpanBytes = kSegmentPieceBytes + 32;

// 16-byte destination units of segment [d, d + len): aligned 16-byte blocks holding its bytes.
KVRAIL_HD uint32_t SegmentUnits(uint64_t d, uint64_t len) {
  return len == 0 ? 0u : static_cast<uint32_t>(((d + len + 15) >> 4) - (d >> 4));
}

// The aligned source span of segment [s, s + len): [begin, begin + bytes), both multiples of 16
// (what one bulk copy may move). Empty for len 0. No byte outside the 16-byte blocks holding the
// segment's bytes is read, so no read leaves the pages the segment lies in.
struct SourceSpanBytes {
  uint64_t begin;
  uint32_t bytes;
};
KVRAIL_HD SourceSpanBytes SourceSpan(uint64_t s, uint64_t len) {
  const uint64_t begin = s & ~uint64_t{15};
  if (len == 0) return SourceSpanBytes{begin, 0};
  return SourceSpanBytes{begin, static_cast<uint32_t>(((s + len + 15) & ~uint64_t{15}) - begin)};
}

// Bytes [lo, hi) of the 16-byte destination block at `block` that belong to the segment whose
// destination bytes are [d_lo, d_hi) (low 32 bits of d and d + len: the differences are small).
struct UnitRange {
  uint32_t lo;
  uint32_t hi;
};
KVRAIL_HD UnitRange UnitBytes(uint64_t block, uint32_t d_lo, uint32_t d_hi) {
  const int32_t lo_rel = static_cast<int32_t>(d_lo - static_cast<uint32_t>(block));
  const int32_t hi_rel = static_cast<int32_t>(d_hi - static_cast<uint32_t>(block));
  return UnitRange{lo_rel > 0 ? static_cast<uint32_t>(lo_rel) : 0u,
                   hi_rel < 16 ? static_cast<uint32_t>(hi_rel) : 16u};
}

// Packing a warp's segments into stages of `stage_bytes`: segment j (in order) goes into the stage
// that begins at segment jn when its span ends within the stage, i.e. the inclusive prefix sum of
// spans `incl_j` minus the sum before jn (`base`) is at most stage_bytes. Spans are at most
// kMaxSegmentSpanBytes <= stage_bytes, so a stage always takes at least one segment.
KVRAIL_HD bool StageFits(uint32_t incl_j, uint32_t base, uint32_t stage_bytes) {
  return incl_j - base <= stage_bytes;
}

// Where destination byte `x` of a segment (source s, destination d) lies in the stage, when the
// segment's span was copied to stage offset `span_at`: span_at + (s & 15) + (x - d). Computed
// modulo 2^32 (shared-memory addresses); for a unit's block, x may be up to 15 bytes before d.
KVRAIL_HD uint32_t StagePos(uint32_t span_at, uint64_t s, uint64_t d, uint64_t x) {
  return span_at + static_cast<uint32_t>(s & 15) + static_cast<uint32_t>(x - d);
}

KVRAIL_HD uint32_t FunnelShiftR(uint32_t lo, uint32_t hi, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, s);
#else
  s &= 31;
  return s == 0 ? lo : (lo >> s) | (hi << (32 - s));
#endif
}

// Bytes [r, r + 16) of the 32 bytes a0..a3, b0..b3 (little-endian words, r < 16), as 4 words.
struct Words4 {
  uint32_t w[4];
};
KVRAIL_HD Words4 Window16(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                          uint32_t b1, uint32_t b2, uint32_t b3, uint32_t r) {
  uint32_t x0 = a0, x1 = a1, x2 = a2, x3 = a3, x4 = b0, x5 = b1, x6 = b2, x7 = b3;
  if (r & 8) {  // two words
    x0 = x2;
    x1 = x3;
    x2 = x4;
    x3 = x5;
    x4 = x6;
    x5 = x7;
  }
  if (r & 4) {  // one word
    x0 = x1;
    x1 = x2;
    x2 = x3;
    x3 = x4;
    x4 = x5;
  }
  const uint32_t sh = 8 * (r & 3);
  return Words4{{FunnelShiftR(x0, x1, sh), FunnelShiftR(x1, x2, sh), FunnelShiftR(x2, x3, sh),
                 FunnelShiftR(x3, x4, sh)}};
}

// Partial units (a segment's first and last when its destination ends are not 16-byte aligned):
// bytes [lo, hi) of a 16-byte block (lo < hi <= 16, not both 0 and 16) go out as at most 8
// naturally aligned stores of 1, 2, 4 or 8 bytes, in a fixed straight-line order (up to the next
// 16-byte boundary by rising sizes, then falling sizes to hi), so that the lanes of a warp with
// different ranges predicate the same instructions instead of diverging in a loop. Calls
// store(offset, size) for each.
template <class Store>
KVRAIL_HD void ForEachPartialStore(uint32_t lo, uint32_t hi, Store&& store) {
  uint32_t p = lo;
  if ((p & 1) && p + 1 <= hi) {
    store(p, 1u);
    p += 1;
  }
  if ((p & 2) && p + 2 <= hi) {
    store(p, 2u);
    p += 2;
  }
  if ((p & 4) && p + 4 <= hi) {
    store(p, 4u);
    p += 4;
  }
  if ((p & 8) && p + 8 <= hi) {
    store(p, 8u);
    p += 8;
  }
  if (p + 8 <= hi) {
    store(p, 8u);
    p += 8;
  }
  if (p + 4 <= hi) {
    store(p, 4u);
    p += 4;
  }
  if (p + 2 <= hi) {
    store(p, 2u);
    p += 2;
  }
  if (p + 1 <= hi) {
    store(p, 1u);
    p += 1;
  }
}

// Merging pieces contiguous on both sides (bulk form): a plan cut per token where consecutive
// tokens of a block are contiguous on both sides (657-byte vectors or MLA tokens between
// different block sizes) has one piece per token; the warp's consecutive such pieces merge into
// runs of at most MergeRunPieces(longest piece of the step) pieces, so a run is at most
// kSegmentPieceBytes: one span, one bulk copy and no partial units at the seams. Lane j's piece
// starts a run when it does not continue lane j - 1's (ContinuesPiece), or every per_run pieces
// of a contiguous stretch that starts at lane run_start (MergeHead).
KVRAIL_HD uint32_t MergeRunPieces(uint32_t max_len) {
  return max_len == 0 || max_len >= kSegmentPieceBytes ? 1u : kSegmentPieceBytes / max_len;
}
KVRAIL_HD bool ContinuesPiece(uint64_t prev_s_end, uint64_t prev_d_end, uint32_t prev_len,
                              uint64_t s, uint64_t d, uint32_t len) {
  return len != 0 && prev_len != 0 && prev_s_end == s && prev_d_end == d;
}
KVRAIL_HD bool MergeHead(bool continues, uint32_t lane, uint32_t run_start, uint32_t per_run) {
  return !continues || (lane - run_start) % per_run == 0;
}

// The split register form (kv_copy.cu, KvCopySegmentsSplitKernel): a
// segment's destination cut into its WHOLE 16-byte units, which the warp moves as one stream of
// plain 16-byte stores (no partial-store path in the per-unit loop), and at most two partial
// units (its first and last destination block when they hold only some of its bytes), which the
// lane that located the segment stores itself. `first_full` is the destination block index
// (address / 16) of the first whole unit; a partial unit's `range.hi` is 0 when there is none.
// The whole units and the partial ones are exactly SegmentUnits(d, len) units, each destination
// byte of the segment in exactly one of them.
struct PartialUnit {
  uint64_t block;   // destination block index (address / 16)
  UnitRange range;  // bytes [lo, hi) of the block; hi == 0: no such unit
};
struct SplitUnits {
  uint64_t first_full;
  uint32_t full;
  PartialUnit head;
  PartialUnit tail;
};
KVRAIL_HD SplitUnits SplitSegment(uint64_t d, uint64_t len) {
  SplitUnits u{0, 0, {0, {0, 0}}, {0, {0, 0}}};
  if (len == 0) return u;
  const uint64_t d_end = d + len;
  const uint64_t first = (d + 15) >> 4;  // first block starting at or after d
  const uint64_t last = d_end >> 4;      // one past the last block ending at or before d_end
  u.first_full = first;
  u.full = last > first ? static_cast<uint32_t>(last - first) : 0u;
  const uint32_t d_lo = static_cast<uint32_t>(d), d_hi = static_cast<uint32_t>(d_end);
  const uint64_t head_block = d >> 4, tail_block = (d_end - 1) >> 4;
  if ((d & 15) != 0) {
    u.head = PartialUnit{head_block, UnitBytes(head_block << 4, d_lo, d_hi)};
  }
  if ((d_end & 15) != 0 && !(tail_block == head_block && (d & 15) != 0)) {
    u.tail = PartialUnit{tail_block, UnitBytes(tail_block << 4, d_lo, d_hi)};
  }
  return u;
}

// Unit u of a warp step whose segments have `full` whole units each (the common case: equal
// chunk lengths and destination alignments) belongs to segment u / full, found with one
// multiply-high by UnitMagic(full) instead of a shuffle search (64 segments with two per lane).
// Exact for u, full < 2^16 (a piece is at most kSegmentPieceBytes: full <= 256, u < 64 * 256).
KVRAIL_HD uint32_t UnitMagic(uint32_t full) {
  return full <= 1 ? 0u : static_cast<uint32_t>(((uint64_t{1} << 32) + full - 1) / full);
}
KVRAIL_HD uint32_t UnitSegment(uint32_t u, uint32_t full, uint32_t magic) {
  return full == 1 ? u : UMulHi32(u, magic);
}

// The segment path's forms (kv_copy_segments.cuh; DevicePlan::segment_form). A value names its
// shape: 6 units per lane and round for the register form, 100 + stages for the bulk-staged form,
// 200 + 10 x (segments per lane - 1) + units per lane for the split register form. The daemon's
// library (//kernels:kv_copy) builds only the forms SegmentFormFor picks; the others exist for
// benchmarks and tests (//kernels:kv_copy_forms, kv_copy_forms.h).
enum class SegmentForm : int {
  kDefault = 0,    // the library's choice for the plan: kBulk3
  kRegisters = 6,  // benchmarks
  kBulk2 = 102,    // benchmarks
  kBulk3 = 103,
  kSplit4 = 204,  // benchmarks
  kSplit6 = 206,
  kSplit4x2 = 214,  // benchmarks
  kSplit6x2 = 216,  // benchmarks
};

// Whether //kernels:kv_copy launches `form` (LaunchKvCopy); the others launch through
// kv_copy_forms.h.
KVRAIL_HD constexpr bool IsDaemonSegmentForm(SegmentForm form) {
  return form == SegmentForm::kDefault || form == SegmentForm::kBulk3 ||
         form == SegmentForm::kSplit6;
}

// Which segment form a plan on the segment path takes (DevicePlan::segment_form; kv_copy.cc,
// Upload), from one H200 at 32 CTAs (docs/benchmarks.md): the split register
// form with one segment and 6 whole units per lane and round (206) for short chunks
// (< kRegisterFormMaxChunk) that cannot merge (head vectors, or token chunks not contiguous from
// token to token): measured 1.2-1.8x the register form there at 32 CTAs
// (0.97-1.09x at 132; 80-384-byte chunks), ahead of one bulk copy per chunk and of two segments
// per lane (214 / 216: 1-27% slower); the
// default (bulk-staged, one bulk copy per piece) otherwise.
inline constexpr uint64_t kRegisterFormMaxChunk = 512;

// Whether consecutive chunks of a plan are contiguous on both sides within a block (token chunks
// whose token stride is the chunk on both sides: MLA tokens or odd vector sizes between
// different block sizes), which the bulk form merges into runs of up to kSegmentPieceBytes.
KVRAIL_HD bool ChunksMayMerge(const PlanHeader& h) {
  return static_cast<ChunkKind>(h.chunk_kind) == ChunkKind::kTokenHeads &&
         h.src.token_stride == h.chunk_bytes && h.dst.token_stride == h.chunk_bytes;
}

// Short chunks that do not merge: each a piece of its own, under kRegisterFormMaxChunk.
KVRAIL_HD bool ShortUnmergedChunks(const PlanHeader& h) {
  return static_cast<ChunkKind>(h.chunk_kind) != ChunkKind::kBytes && !ChunksMayMerge(h) &&
         h.chunk_bytes < kRegisterFormMaxChunk;
}

KVRAIL_HD SegmentForm SegmentFormFor(const PlanHeader& h) {
  return ShortUnmergedChunks(h) ? SegmentForm::kSplit6 : SegmentForm::kDefault;
}

// Whether a plan whose inner loop is not the warp path takes the segment path rather than the
// slab path: chunked plans (not kBytes) whose access width (narrowed to the bases) is under 8
// bytes, and wider-access plans of short chunks that do not merge where the split form beat the
// slab path at 32 CTAs (at 132 within 2%, one layout 1.8% slower): 8-byte
// accesses (232-byte head vectors: slab 324 GB/s, split 502-517) and 16-byte head vectors
// (192-336 bytes: 539-551 -> 567-640; 256-byte ones 625-682 -> 655-694). Not chosen: 16-byte token
// chunks (TP1 -> TP8's 256-byte tokens 626 on the slab path against 489; 384-512-byte tokens
// 710-726 against 628-668), and merging 16-byte token chunks (MLA 576/656-byte tokens, 64 -> 16
// tokens per block: faster on the bulk or split form at 32 CTAs, 754-810 against 711-733, but
// slower at 132, 1532-1626 against 1598-1643) (docs/benchmarks.md).
KVRAIL_HD bool TakesSegmentPath(const PlanHeader& h, uint32_t access_bytes) {
  if (static_cast<ChunkKind>(h.chunk_kind) == ChunkKind::kBytes) return false;
  if (access_bytes < 8) return true;
  return ShortUnmergedChunks(h) &&
         (access_bytes == 8 || static_cast<ChunkKind>(h.chunk_kind) == ChunkKind::kHeadVector);
}

// The stage size of the bulk-staged form for a launch of `warps` warps with `stages` stages each
// in `budget` bytes of shared memory (plus kStageRingPad): the largest multiple of 16 that fits,
// at most kMaxStageBytes; 0 when it is under kMaxSegmentSpanBytes (that launch shape cannot
// take the bulk form).
inline constexpr uint32_t kMaxStageBytes = 16384;
// Shared memory before the first stage (unit reads may start up to 15 bytes before a span) and
// after the last (the second 16-byte read of a tail unit may end up to 31 bytes past it).
inline constexpr uint32_t kStageRingHead = 16;
inline constexpr uint32_t kStageRingPad = 16 + 32;
KVRAIL_HD uint32_t StageBytesFor(uint32_t budget, uint32_t warps, uint32_t stages) {
  if (warps == 0 || stages == 0 || budget < kStageRingPad) return 0;
  uint32_t b = (budget - kStageRingPad) / (warps * stages) / 16 * 16;
  if (b > kMaxStageBytes) b = kMaxStageBytes;
  return b < kMaxSegmentSpanBytes ? 0u : b;
}

}  // namespace kvrail::kernels
