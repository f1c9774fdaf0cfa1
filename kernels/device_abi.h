// The one contract between host and device code. Plain POD structs only: the planner fills them
// on the host, the engine adds device addresses and uploads them, the kernels read them. Every
// field says who writes it. Sizes are static_assert'ed so host (g++) and device (nvcc) agree.
//
// A plan is compact: geometry + strides + two uint32 block tables, never one descriptor per
// block. The kernel (and the host twin) compute every address with kernels/plan_math.h.
//
// Index space of a paged transfer: (layer l, part p, token i, head h), each element a head vector
// of `vector_bytes` contiguous bytes. For each (l, p) the tokens x heads form a byte "stream" of
// `part_bytes` bytes in transfer order (token-major, heads inner). The stream is cut into
// "chunks": the largest unit contiguous on BOTH sides (see ChunkKind). Tiles cut each (l, p)
// stream into ranges of about `tile_bytes`; tiles never span a (layer, part) and are numbered
// layer by layer, so per-layer completion is known from tile counts.
#pragma once

#include <stdint.h>

namespace kvrail::kernels {

// What one chunk of a (layer, part) stream is. Written by the planner.
enum class ChunkKind : uint32_t {
  // Bytes regions: one contiguous range, layer 0, part 0; chunk = the whole range.
  kBytes = 0,
  // One head vector (token i, head h): chunk c is (i = c / num_heads, h = c % num_heads).
  kHeadVector = 1,
  // All transferred heads of one token (head_stride == vector_bytes on both sides): chunk c is
  // token i = c.
  kTokenHeads = 2,
  // All tokens of one block (token_stride == heads bytes on both sides, equal tokens_per_block):
  // chunk c is block-table entry c, tokens [c*tpb, min((c+1)*tpb, num_tokens)). Only the last
  // chunk of a stream may be short.
  kBlockTokens = 3,
};

// Division by a run-time constant with a multiply and a shift (dividends must be < 2^31).
// Written by the planner (plan_math.h: MakeFastDiv); read by host twin and kernel.
struct FastDivU32 {
  uint32_t divisor;     // planner: d > 0
  uint32_t multiplier;  // planner: ceil(2^(31+s) / d), s = ceil(log2 d); unused when d == 1
  uint32_t shift;       // planner: s - 1 (applied after taking the high 32 bits)
  uint32_t reserved;    // planner: 0
};
static_assert(sizeof(FastDivU32) == 16, "FastDivU32 ABI");

// The resolved geometry of one side (src or dst) of a paged transfer.
struct SideGeometry {
  // planner: offset_bytes + layer_begin*layer_stride + head_begin*head_stride, i.e. the byte
  // offset (from the region base) of transfer element (l=0, p=0, token slot 0 of block 0, h=0).
  uint64_t origin;
  // planner: byte strides of the region's layout (resolved, never all zero).
  uint64_t layer_stride;
  uint64_t part_stride;
  uint64_t block_stride;
  uint64_t token_stride;
  uint64_t head_stride;
  // planner: this side's tokens_per_block, as a fast divisor.
  FastDivU32 tokens_per_block;
  // engine: device (or host) address of the region base; 0 in a host-side plan, and 0 for a
  // per-layer side (its table below holds whole addresses).
  uint64_t base;
  // engine: device address of this side's uint32 block table; 0 in a host-side plan.
  uint64_t block_table;
  // planner: entries in this side's block table (blocks actually touched by the transfer).
  uint32_t num_table_blocks;
  // planner: first layer / head of this side in the region's numbering (informational; already
  // folded into `origin`).
  uint32_t layer_begin;
  uint32_t head_begin;
  uint32_t reserved;  // planner: 0
  // Per-layer regions (RegionSpec.layer_shares; layer_stride is then 0): the address of a table
  // of uint64 layer addresses, entry L = the address of region layer L's first byte (the
  // layout's offset_bytes and every other stride apply inside each layer). Indexed by
  // layer_begin + l. 0: a single-base side (layer l at base + origin + l * layer_stride).
  // planner: the host table of the region's own addresses (host addresses for host memory,
  // device addresses for CUDA memory), which host code (host twin, copy-engine batches, fabric
  // packing) reads; engine: the CUDA engine's uploaded header points at a device copy holding the
  // addresses valid on the GPU that runs the kernel. Always read through plan_math.h
  // (LayerOffset).
  uint64_t layer_bases;
};
static_assert(sizeof(SideGeometry) == 104, "SideGeometry ABI");

// The compact plan: everything the kernel needs besides the two block tables.
struct PlanHeader {
  SideGeometry src;  // planner (+ engine: base, block_table)
  SideGeometry dst;  // planner (+ engine: base, block_table)
  // planner: ChunkKind as uint32.
  uint32_t chunk_kind;
  // planner: index-space dims: layers, parts (1 or 2) and heads moved by the transfer.
  uint32_t num_layers;
  uint32_t num_parts;
  uint32_t num_heads;
  // planner: tokens moved (< 2^31 / num_heads so chunk indices fit fast division).
  uint64_t num_tokens;
  // planner: bytes of one head vector (head_dim * dtype size); for kBytes: 1.
  uint32_t vector_bytes;
  // planner: widest access (1, 2, 4, 8 or 16 bytes) that divides every chunk length, chunk
  // start offset, stride and tile boundary on both sides. The engine narrows it further to the
  // alignment of the base pointers it writes.
  uint32_t access_bytes;
  // planner: bytes of a full chunk (kBytes: part_bytes).
  uint64_t chunk_bytes;
  // planner: bytes of one (layer, part) stream: num_tokens * num_heads * vector_bytes.
  uint64_t part_bytes;
  // planner: chunk_bytes and num_heads as fast divisors (chunk_div unused for kBytes).
  FastDivU32 chunk_div;
  FastDivU32 heads_div;
  // planner: bytes per tile (multiple of access_bytes, <= 2^30); the last tile of each
  // (layer, part) stream may be shorter.
  uint64_t tile_bytes;
  // planner: tiles per (layer, part) stream, and in total (= layers * parts * tiles_per_part).
  uint32_t tiles_per_part;
  uint32_t num_tiles;
  // planner: bytes moved by the whole transfer.
  uint64_t bytes_total;
};
static_assert(sizeof(PlanHeader) == 2 * 104 + 104, "PlanHeader ABI");

// Which slice of the index space a tile covers. Computed (plan_math.h: TileAt), never stored
// per tile: tile t covers layer t / (parts * tiles_per_part).
struct TileDesc {
  uint32_t layer;       // layer index within the transfer (0-based)
  uint32_t part;        // part index (0: K or joint latent, 1: V)
  uint64_t byte_begin;  // [byte_begin, byte_end) within the (layer, part) stream
  uint64_t byte_end;
};
static_assert(sizeof(TileDesc) == 24, "TileDesc ABI");

// One slot of the GPU -> NIC command ring (daemon/fabric/command_ring.h), in pinned, GPU-mapped
// host memory. Each NIC has its own ring, so the NIC is implied; `peer` says whose staging on
// that NIC. The producer (the packing kernel on a GPU machine; the fabric sender's packer here)
// packs a tile into send slot `slot` of (peer, NIC), then writes one command; the NIC's proxy
// thread turns it into one fi_writedata whose immediate data names (transfer, tile).
// Publication protocol: every field but `epoch` first, `epoch` last with release semantics; the
// proxy takes the command once `epoch` equals the ring lap of its sequence number.
struct NicCommand {
  uint32_t opcode;         // producer: 0 none, 1 write tile (fabric: kOpWriteTile)
  uint32_t tile;           // producer: tile index within the transfer (low 32 bits of imm data)
  uint32_t slot;           // producer: send slot of (peer, NIC) (send slot s -> peer's recv slot s)
  uint16_t peer;           // engine: the receiving peer's index in this daemon's peer table
  uint16_t remote_handle;  // engine: the receiver's handle for the transfer (from Begin)
  uint64_t transfer_tag;   // engine: the sender daemon's transfer id, copied by the producer
  uint32_t bytes;          // producer: packed bytes of the tile in the slot
  uint32_t epoch;          // producer, written last: ring lap (seq / capacity + 1), never reset
};
static_assert(sizeof(NicCommand) == 32, "NicCommand is one 32-byte ring slot");

}  // namespace kvrail::kernels
