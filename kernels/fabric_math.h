// The fabric kernels' arithmetic, shared by the CUDA kernels (fabric_pack.cu)
// and their host twin, so CI checks without a GPU the code the kernels run. Built only from
// plan_math.h (TileAt, AdvanceChunkPos, ChunkAtInLayer: the walk the copy kernel's slab path and
// planner::ForEachTileRun use); nothing here computes an address any other way.
//
// A fabric tile travels packed: the tile's bytes of its (layer, part) stream in stream order, so
// packed byte q of tile t is stream byte t.byte_begin + q, wherever each side keeps it. The
// sender's kernel gathers with the plan's source side into the send slot; the receiver's kernel
// scatters with its plan's destination side out of the receive slot (the layout conversion).
// Both move "units" of W bytes (W = the plan's access width narrowed to the base addresses; W
// divides every chunk length, chunk start and tile boundary, so a unit never crosses a chunk):
// unit at packed offset q of tile t lies, on the chosen side, at FabricUnitOffset(.., q, ..).
#pragma once

#include <stdint.h>

#include "kernels/device_abi.h"
#include "kernels/plan_math.h"

namespace kvrail::kernels {

// NicCommand.opcode of a tile write (daemon/fabric/command_ring.h kOpWriteTile; checked equal
// there by a static_assert).
inline constexpr uint32_t kFabricOpWriteTile = 1;

// Where tile t starts in its stream, as a chunk position (the one 64-bit division per tile; the
// units then advance with 32-bit fast divisions). Unused for kBytes plans.
KVRAIL_HD ChunkPos FabricTileStart(const PlanHeader& h, const TileDesc& t) {
  if (static_cast<ChunkKind>(h.chunk_kind) == ChunkKind::kBytes) return ChunkPos{0, 0};
  ChunkPos start;
  if (t.byte_begin <= kFastDivMaxDividend) {
    start.chunk = FastDiv(h.chunk_div, static_cast<uint32_t>(t.byte_begin));
    start.offset =
        static_cast<uint32_t>(t.byte_begin) - start.chunk * static_cast<uint32_t>(h.chunk_bytes);
  } else {
    start.chunk = static_cast<uint32_t>(t.byte_begin / h.chunk_bytes);
    start.offset = static_cast<uint32_t>(t.byte_begin % h.chunk_bytes);
  }
  return start;
}

// Offset (from the side's SideBase) of packed byte `packed` of tile `t` on the source side
// (`src_side`) or the destination side. `layer` is LayerAt(h, t.layer), `start`
// FabricTileStart(h, t). Valid for any packed < tile length; the bytes up to the end of the
// unit (W bytes) follow contiguously when `packed` is a multiple of the plan's access width.
KVRAIL_HD uint64_t FabricUnitOffset(const PlanHeader& h, const uint32_t* src_blocks,
                                    const uint32_t* dst_blocks, const TileDesc& t, LayerSpan layer,
                                    ChunkPos start, uint32_t packed, bool src_side) {
  if (static_cast<ChunkKind>(h.chunk_kind) == ChunkKind::kBytes) {
    return (src_side ? h.src.origin : h.dst.origin) + t.byte_begin + packed;
  }
  const ChunkPos pos = AdvanceChunkPos(h, start, packed);
  const ChunkSpan span = ChunkAtInLayer(h, src_blocks, dst_blocks, layer, t.part, pos.chunk);
  return (src_side ? span.src : span.dst) + pos.offset;
}

// The NicCommand the packing kernel publishes for tile `tile` packed into send slot `slot`: the
// producer's fields (opcode, tile, slot, bytes: the packed length) computed here, the engine's
// (peer, remote_handle, transfer_tag) copied from `engine`. `epoch` is left 0: the kernel
// writes it last, with a system-scope release.
KVRAIL_HD NicCommand FabricTileCommand(const PlanHeader& h, uint32_t tile, uint32_t slot,
                                       const NicCommand& engine) {
  const TileDesc t = TileAt(h, tile);
  NicCommand c{};
  c.opcode = kFabricOpWriteTile;
  c.tile = tile;
  c.slot = slot;
  c.peer = engine.peer;
  c.remote_handle = engine.remote_handle;
  c.transfer_tag = engine.transfer_tag;
  c.bytes = static_cast<uint32_t>(t.byte_end - t.byte_begin);
  c.epoch = 0;
  return c;
}

// The host twin of the kernels' data movement for one tile: unit by unit, exactly the kernels'
// offsets. Pack: region (source side) -> packed; unpack: packed -> region (destination side).
// `region` is the side's region base (SideBase applies: per-layer sides use whole addresses);
// `width` the unit width the kernel would use (a divisor of the plan's access width).
inline void FabricPackTileTwin(const PlanHeader& h, const uint32_t* src_blocks,
                               const uint32_t* dst_blocks, uint32_t tile, uint32_t width,
                               const uint8_t* region, uint8_t* packed) {
  const TileDesc t = TileAt(h, tile);
  const LayerSpan layer = LayerAt(h, t.layer);
  const ChunkPos start = FabricTileStart(h, t);
  const uint64_t base = SideBase(h.src, reinterpret_cast<uint64_t>(region));
  const uint32_t n = static_cast<uint32_t>(t.byte_end - t.byte_begin);
  for (uint32_t q = 0; q < n; q += width) {
    const uint8_t* from = reinterpret_cast<const uint8_t*>(
        base + FabricUnitOffset(h, src_blocks, dst_blocks, t, layer, start, q, true));
    for (uint32_t b = 0; b < width; ++b) packed[q + b] = from[b];
  }
}

inline void FabricUnpackTileTwin(const PlanHeader& h, const uint32_t* src_blocks,
                                 const uint32_t* dst_blocks, uint32_t tile, uint32_t width,
                                 const uint8_t* packed, uint8_t* region) {
  const TileDesc t = TileAt(h, tile);
  const LayerSpan layer = LayerAt(h, t.layer);
  const ChunkPos start = FabricTileStart(h, t);
  const uint64_t base = SideBase(h.dst, reinterpret_cast<uint64_t>(region));
  const uint32_t n = static_cast<uint32_t>(t.byte_end - t.byte_begin);
  for (uint32_t q = 0; q < n; q += width) {
    uint8_t* to = reinterpret_cast<uint8_t*>(
        base + FabricUnitOffset(h, src_blocks, dst_blocks, t, layer, start, q, false));
    for (uint32_t b = 0; b < width; ++b) to[b] = packed[q + b];
  }
}

}  // namespace kvrail::kernels
