// Address arithmetic of a compact plan (device_abi.h), shared by the CUDA kernel and the host twin
// so that CI checks, without a GPU, the very code the kernel runs.
//
// Element (layer l, part p, token i, head h) of a transfer lives, on each side, at
//   offset + (layer_begin + l)*Ls + p*Ps + blocks[i / T]*Bs + (i % T)*Ts + (head_begin + h)*Hs
// where T is that side's tokens_per_block and blocks its block table; `origin` already holds
// offset + layer_begin*Ls + head_begin*Hs. Each element is a head vector of vector_bytes bytes.
// A per-layer side (SideGeometry.layer_bases != 0, Ls == 0) replaces (layer_begin + l)*Ls by
// layer_bases[layer_begin + l], the whole address of that layer: the one place that knows is
// LayerOffset below, and everything else (kernel, host twin, copy-engine batches, fabric packing)
// goes through it. Offsets are added to the side's base (SideBase: 0 for per-layer sides).
#pragma once

#include <stdint.h>

#include "kernels/device_abi.h"

#ifdef __CUDACC__
#define KVRAIL_HD __host__ __device__ __forceinline__
#else
#define KVRAIL_HD inline
#endif

namespace kvrail::kernels {

// Largest dividend FastDiv is exact for.
inline constexpr uint32_t kFastDivMaxDividend = 0x7fffffffu;

KVRAIL_HD uint32_t UMulHi32(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// Builds a fast divisor for d (d > 0). Host side (the planner), but harmless on the device.
KVRAIL_HD FastDivU32 MakeFastDiv(uint32_t d) {
  FastDivU32 f{d, 0, 0, 0};
  if (d <= 1) return f;
  uint32_t s = 0;
  while ((uint64_t{1} << s) < d) ++s;  // s = ceil(log2 d) >= 1
  const uint64_t p = uint64_t{1} << (31 + s);
  f.multiplier = static_cast<uint32_t>((p + d - 1) / d);
  f.shift = s - 1;
  return f;
}

// n / d for n <= kFastDivMaxDividend.
KVRAIL_HD uint32_t FastDiv(const FastDivU32& f, uint32_t n) {
  return f.divisor == 1 ? n : (UMulHi32(n, f.multiplier) >> f.shift);
}

// Where transfer layer l (0-based within the transfer) of a side starts, relative to SideBase:
// l * layer_stride for a single-base side (layer_begin is in `origin`), the table entry
// layer_bases[layer_begin + l] for a per-layer side. Callers that visit many elements of one layer
// (a tile never spans layers) compute it once and use the *InLayer forms below.
KVRAIL_HD uint64_t LayerOffset(const SideGeometry& g, uint32_t l) {
  return g.layer_bases != 0 ? reinterpret_cast<const uint64_t*>(g.layer_bases)[g.layer_begin + l]
                            : static_cast<uint64_t>(l) * g.layer_stride;
}

// What plan offsets of a side are added to: the region base `base` for a single-base side, 0 for
// a per-layer side (its offsets are whole addresses).
KVRAIL_HD uint64_t SideBase(const SideGeometry& g, uint64_t base) {
  return g.layer_bases != 0 ? 0 : base;
}

// ElementOffset with the layer's LayerOffset already computed (`layer`).
KVRAIL_HD uint64_t ElementOffsetInLayer(const SideGeometry& g, const uint32_t* blocks,
                                        uint64_t layer, uint32_t p, uint32_t i, uint32_t h) {
  const uint32_t block_index = FastDiv(g.tokens_per_block, i);
  const uint32_t slot = i - block_index * g.tokens_per_block.divisor;
  return g.origin + layer + p * g.part_stride +
         static_cast<uint64_t>(blocks[block_index]) * g.block_stride + slot * g.token_stride +
         h * g.head_stride;
}

// Offset (from SideBase) of element (l, p, i, h), exactly the formula above. `blocks` is that
// side's block table.
KVRAIL_HD uint64_t ElementOffset(const SideGeometry& g, const uint32_t* blocks, uint32_t l,
                                 uint32_t p, uint32_t i, uint32_t h) {
  return ElementOffsetInLayer(g, blocks, LayerOffset(g, l), p, i, h);
}

// Chunks in one (layer, part) stream.
KVRAIL_HD uint64_t ChunksPerPart(const PlanHeader& h) {
  return (h.part_bytes + h.chunk_bytes - 1) / h.chunk_bytes;
}

// One chunk: where it starts on each side (offsets from the region bases) and its length.
struct ChunkSpan {
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
};

// The LayerOffset of one transfer layer on both sides.
struct LayerSpan {
  uint64_t src;
  uint64_t dst;
};
KVRAIL_HD LayerSpan LayerAt(const PlanHeader& h, uint32_t l) {
  return LayerSpan{LayerOffset(h.src, l), LayerOffset(h.dst, l)};
}

// ChunkAt with the layer's offsets already computed (LayerAt(h, l)).
KVRAIL_HD ChunkSpan ChunkAtInLayer(const PlanHeader& h, const uint32_t* src_blocks,
                                   const uint32_t* dst_blocks, LayerSpan layer, uint32_t p,
                                   uint32_t c) {
  switch (static_cast<ChunkKind>(h.chunk_kind)) {
    case ChunkKind::kBytes:
      return ChunkSpan{h.src.origin, h.dst.origin, h.part_bytes};
    case ChunkKind::kBlockTokens: {
      // Whole blocks: slot 0 of block-table entry c on both sides (equal tokens_per_block).
      const uint64_t begin = static_cast<uint64_t>(c) * h.chunk_bytes;
      const uint64_t left = h.part_bytes - begin;
      return ChunkSpan{h.src.origin + layer.src + p * h.src.part_stride +
                           static_cast<uint64_t>(src_blocks[c]) * h.src.block_stride,
                       h.dst.origin + layer.dst + p * h.dst.part_stride +
                           static_cast<uint64_t>(dst_blocks[c]) * h.dst.block_stride,
                       left < h.chunk_bytes ? left : h.chunk_bytes};
    }
    case ChunkKind::kTokenHeads:
      return ChunkSpan{ElementOffsetInLayer(h.src, src_blocks, layer.src, p, c, 0),
                       ElementOffsetInLayer(h.dst, dst_blocks, layer.dst, p, c, 0), h.chunk_bytes};
    case ChunkKind::kHeadVector:
    default: {
      const uint32_t i = FastDiv(h.heads_div, c);
      const uint32_t head = c - i * h.num_heads;
      return ChunkSpan{ElementOffsetInLayer(h.src, src_blocks, layer.src, p, i, head),
                       ElementOffsetInLayer(h.dst, dst_blocks, layer.dst, p, i, head),
                       h.chunk_bytes};
    }
  }
}

// Chunk `c` (< ChunksPerPart) of stream (l, p). For kBytes only c == 0 exists.
KVRAIL_HD ChunkSpan ChunkAt(const PlanHeader& h, const uint32_t* src_blocks,
                            const uint32_t* dst_blocks, uint32_t l, uint32_t p, uint32_t c) {
  return ChunkAtInLayer(h, src_blocks, dst_blocks, LayerAt(h, l), p, c);
}

// The slice of the index space tile t (< num_tiles) covers.
KVRAIL_HD TileDesc TileAt(const PlanHeader& h, uint32_t t) {
  const uint32_t per_layer = h.num_parts * h.tiles_per_part;
  const uint32_t layer = t / per_layer;
  const uint32_t rest = t - layer * per_layer;
  const uint32_t part = rest / h.tiles_per_part;
  const uint32_t k = rest - part * h.tiles_per_part;
  const uint64_t begin = static_cast<uint64_t>(k) * h.tile_bytes;
  const uint64_t end = begin + h.tile_bytes < h.part_bytes ? begin + h.tile_bytes : h.part_bytes;
  return TileDesc{layer, part, begin, end};
}

// Locates stream byte `q` of (l, p): the chunk holding it and the offset inside that chunk, given
// the chunk index c0 and offset r0 of some earlier stream byte q0 (q0 <= q, q - q0 + r0 <=
// kFastDivMaxDividend). Lets the kernel do one 64-bit division per tile and 32-bit ones after.
struct ChunkPos {
  uint32_t chunk;
  uint32_t offset;
};
KVRAIL_HD ChunkPos AdvanceChunkPos(const PlanHeader& h, ChunkPos from, uint32_t delta) {
  const uint32_t t = from.offset + delta;
  const uint32_t k = FastDiv(h.chunk_div, t);
  return ChunkPos{from.chunk + k, t - k * static_cast<uint32_t>(h.chunk_bytes)};
}

// The kernel's warp path cuts every tile into "pieces" of P bytes (a power of two, 512..4096),
// each inside one chunk, and gives each warp a whole piece: one table lookup per 4 KiB instead of
// per 16-byte access (measured on H200, scattered 4-128 KiB blocks GPU0 -> GPU1: 338-350 GB/s
// at 8-16 CTAs against 180-320 for the per-slab scheme; docs/benchmarks.md). Returns P, or 0 when
// the plan does not allow it: the access width must be 16 bytes, and P must divide the tile size
// and (except for kBytes, whose one chunk is the whole stream) the chunk size, so that no piece
// crosses a chunk or a tile boundary. Head-vector chunks (< 512 bytes) take the slab path.
inline constexpr uint32_t kMaxPieceBytes = 4096;
inline constexpr uint32_t kMinPieceBytes = 512;
KVRAIL_HD uint32_t PieceBytesFor(const PlanHeader& h, uint32_t access_bytes) {
  if (access_bytes != 16) return 0;
  for (uint32_t p = kMaxPieceBytes; p >= kMinPieceBytes; p /= 2) {
    const bool chunk_ok =
        static_cast<ChunkKind>(h.chunk_kind) == ChunkKind::kBytes ||
        (static_cast<ChunkKind>(h.chunk_kind) != ChunkKind::kHeadVector && h.chunk_bytes % p == 0);
    if (chunk_ok && h.tile_bytes % p == 0) return p;
  }
  return 0;
}

// Piece `k` of tile `t` (pieces are numbered from the tile's first byte; P from PieceBytesFor):
// its start on both sides and its length, which is 0 for pieces past the end of a short last
// tile and P or less otherwise. This form takes the tile's layer offsets already computed
// (LayerAt(h, t.layer)); PieceAt below computes them.
KVRAIL_HD ChunkSpan PieceAtInLayer(const PlanHeader& h, const uint32_t* src_blocks,
                                   const uint32_t* dst_blocks, const TileDesc& t, LayerSpan layer,
                                   uint64_t k, uint32_t piece_bytes) {
  const uint64_t begin = t.byte_begin + k * piece_bytes;
  if (begin >= t.byte_end) return ChunkSpan{0, 0, 0};
  const uint64_t left = t.byte_end - begin;
  const uint64_t bytes = left < piece_bytes ? left : piece_bytes;
  if (static_cast<ChunkKind>(h.chunk_kind) == ChunkKind::kBytes) {
    return ChunkSpan{h.src.origin + begin, h.dst.origin + begin, bytes};
  }
  uint32_t chunk;
  uint64_t offset;
  if (begin <= kFastDivMaxDividend) {
    chunk = FastDiv(h.chunk_div, static_cast<uint32_t>(begin));
    offset = begin - static_cast<uint64_t>(chunk) * h.chunk_bytes;
  } else {
    chunk = static_cast<uint32_t>(begin / h.chunk_bytes);
    offset = begin % h.chunk_bytes;
  }
  const ChunkSpan span = ChunkAtInLayer(h, src_blocks, dst_blocks, layer, t.part, chunk);
  return ChunkSpan{span.src + offset, span.dst + offset, bytes};
}

// The kernel's segment path, for chunked plans the warp path cannot take (head-vector
// chunks, odd vector sizes, odd offsets, padded strides): a warp moves whole "segments", segment
// k of tile t being the part of chunk (first chunk of t) + k inside the tile, with one chunk
// lookup per segment (not per access) and the widest accesses each segment's own addresses allow.
// Every tile gets the same number of segment slots (a tile of tile_bytes touches at most
// ceil(tile_bytes / chunk_bytes) + 1 chunks); slots past the tile's end are empty. Not for kBytes
// (one chunk: the whole stream).
KVRAIL_HD uint64_t SegmentsPerTile(const PlanHeader& h) {
  return (h.tile_bytes + h.chunk_bytes - 1) / h.chunk_bytes + 1;
}

// Segment `k` (< SegmentsPerTile) of tile `t`: where it starts on both sides and its length (0
// for an empty slot). `layer` is LayerAt(h, t.layer).
KVRAIL_HD ChunkSpan SegmentAtInLayer(const PlanHeader& h, const uint32_t* src_blocks,
                                     const uint32_t* dst_blocks, const TileDesc& t, LayerSpan layer,
                                     uint64_t k) {
  uint64_t first;
  if (t.byte_begin <= kFastDivMaxDividend) {
    first = FastDiv(h.chunk_div, static_cast<uint32_t>(t.byte_begin));
  } else {
    first = t.byte_begin / h.chunk_bytes;
  }
  const uint64_t c = first + k;
  const uint64_t chunk_begin = c * h.chunk_bytes;
  if (chunk_begin >= t.byte_end) return ChunkSpan{0, 0, 0};
  const uint64_t begin = chunk_begin > t.byte_begin ? chunk_begin : t.byte_begin;
  const uint64_t chunk_end = chunk_begin + h.chunk_bytes;
  const uint64_t end = chunk_end < t.byte_end ? chunk_end : t.byte_end;
  const ChunkSpan span =
      ChunkAtInLayer(h, src_blocks, dst_blocks, layer, t.part, static_cast<uint32_t>(c));
  return ChunkSpan{span.src + (begin - chunk_begin), span.dst + (begin - chunk_begin), end - begin};
}

KVRAIL_HD ChunkSpan SegmentAt(const PlanHeader& h, const uint32_t* src_blocks,
                              const uint32_t* dst_blocks, const TileDesc& t, uint64_t k) {
  return SegmentAtInLayer(h, src_blocks, dst_blocks, t, LayerAt(h, t.layer), k);
}

KVRAIL_HD ChunkSpan PieceAt(const PlanHeader& h, const uint32_t* src_blocks,
                            const uint32_t* dst_blocks, const TileDesc& t, uint64_t k,
                            uint32_t piece_bytes) {
  return PieceAtInLayer(h, src_blocks, dst_blocks, t, LayerAt(h, t.layer), k, piece_bytes);
}

}  // namespace kvrail::kernels
