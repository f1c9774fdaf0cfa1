// The planner: turns a validated transfer request into a compact plan (kernels/device_abi.h) and
// executes plans on the host (the "host twin" of the CUDA kernel). Pure: no I/O, no CUDA, no
// clocks, no threads of its own and no process-wide state (table memory and a second checking
// thread are injected: TableAllocator, TableCheckRunner). Functions are thread-safe. Everything a
// transfer could get wrong is rejected here, before anything moves: every byte a plan touches lies
// inside its region. One exception, asked for by the caller (PlanOptions::defer_checks_from): the
// per-id checks of very large block tables run slice by slice as tiles start (Plan::CheckTiles), so
// checking 262k ids no longer delays the first byte; no tile runs before the ids it uses have
// passed, so the guarantee about bytes is unchanged.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "kernels/device_abi.h"
#include "kernels/plan_math.h"
#include "proto/kvrail/v1/region.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::planner {

// Where a plan's block tables get their memory (PlanOptions::tables). A 262k-block transfer's two
// tables are 2 MiB; taken fresh from the heap for every plan, that memory is faulted in page by
// page on each submit (512 faults, ~1 ms on the build VM, more on the GPU machine's VM:
// docs/benchmarks.md). Callers that plan often therefore pass a pool that keeps freed buffers for
// the next plan, pinned host memory for the CUDA engine (its plan upload is then an asynchronous
// DMA instead of a copy the driver stages synchronously): //daemon/planner:table_pool. The pure
// planner holds no pool itself; without one it takes plain heap memory.
// Implementations are thread-safe (plans are made on many threads at once).
class TableAllocator {
 public:
  struct Memory {
    std::shared_ptr<void> memory;  // nullptr: no memory could be had
    bool pinned = false;           // host memory a GPU copy engine reads without staging
  };
  virtual ~TableAllocator() = default;
  // At least `bytes` of memory, given back (freed or recycled) when the last copy of `memory` is
  // dropped; that may happen after the allocator itself is gone, so an implementation keeps what
  // it needs alive.
  virtual Memory Take(size_t bytes) = 0;
};

// Runs the copy-and-check of a plan's two block tables (PlanOptions::table_checks). Without one,
// MakePlan does one side after the other on the caller's thread; the threaded runner
// (//daemon/planner:parallel_table_checks) does the two sides on two threads for large tables.
// Implementations are thread-safe.
class TableCheckRunner {
 public:
  virtual ~TableCheckRunner() = default;
  // Runs `src` and `dst`, which are independent of each other (each writes only its own result),
  // and returns once both have returned. `ids`: both tables' ids together (the runner's measure
  // of whether a second thread pays).
  virtual void RunBoth(size_t ids, absl::FunctionRef<void()> src,
                       absl::FunctionRef<void()> dst) = 0;
};

// A block table: `size()` uint32 block ids in memory from a TableAllocator (or the heap). Copies
// share the memory (it is written only while the plan is built); the memory goes back to its
// allocator when the last copy is gone. Not thread-safe to write.
class BlockTable {
 public:
  BlockTable() = default;
  // `n` uninitialized ids from `allocator` (nullptr: the heap); when the memory cannot be had, a
  // table whose ok() is false.
  static BlockTable Allocate(size_t n, TableAllocator* allocator);

  bool ok() const { return n_ == 0 || memory_ != nullptr; }
  uint32_t* data() { return static_cast<uint32_t*>(memory_.get()); }
  const uint32_t* data() const { return static_cast<const uint32_t*>(memory_.get()); }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  uint32_t operator[](size_t i) const { return data()[i]; }
  // Keeps the first `n` ids (n <= size()); the memory stays.
  void Truncate(size_t n) { n_ = n < n_ ? n : n_; }
  // Whether the memory is pinned host memory (a GPU can copy from it asynchronously).
  bool pinned() const { return pinned_; }
  // Holds the memory for as long as the returned pointer lives (an asynchronous upload).
  std::shared_ptr<const void> Hold() const { return memory_; }

  friend bool operator==(const BlockTable& a, const BlockTable& b);

 private:
  std::shared_ptr<void> memory_;
  size_t n_ = 0;
  bool pinned_ = false;
};

// A paged KV layout with every value resolved (strides derived when the proto gave none).
struct KvLayout {
  uint32_t num_layers = 0;
  uint32_t num_parts = 0;
  uint32_t num_blocks = 0;
  uint32_t tokens_per_block = 0;
  uint32_t num_heads = 0;
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 0;
  int dtype = 0;  // kvrail.v1.DType number (bytes are moved, never converted)
  uint64_t layer_stride = 0;
  uint64_t part_stride = 0;
  uint64_t block_stride = 0;
  uint64_t token_stride = 0;
  uint64_t head_stride = 0;
  uint64_t offset = 0;
};

// Resolves and validates a layout for a region of `region_size` bytes. Strides are derived from
// `order` when all five are zero. Checks: non-zero dims, parts 1 or 2, a known dtype, strides that
// are multiples of the dtype size, no two head vectors sharing bytes, and offset + extent <=
// region_size. Errors are INVALID_ARGUMENT and start with `field_prefix` + the field name, e.g.
// "spec.paged_kv.block_stride: ...".
absl::StatusOr<KvLayout> ResolveLayout(const kvrail::v1::PagedKvLayout& proto, uint64_t region_size,
                                       std::string_view field_prefix);

// The layout of a per-layer region (RegionSpec.layer_shares): every layer starts at its own base,
// so layer_stride must be 0 (INVALID_ARGUMENT "<prefix>layer_stride: ..." otherwise; derived
// strides get layer_stride 0 and the others as for one layer), the layers are not checked against
// each other, and `layer_size` is the bytes of ONE layer's span, which offset + the extent of one
// layer must fit. With per_layer false, the same as above.
absl::StatusOr<KvLayout> ResolveLayout(const kvrail::v1::PagedKvLayout& proto, uint64_t region_size,
                                       std::string_view field_prefix, bool per_layer);

// Per-layer regions: entry L is the address of region layer L's first byte, as host code reads
// it (host addresses for host memory, device addresses on the region's own GPU for CUDA memory).
using LayerBases = std::vector<uint64_t>;

// What the planner needs to know about a registered region.
struct RegionView {
  uint64_t size_bytes = 0;  // per-layer regions: bytes of one layer's span
  bool writable = false;
  bool paged = false;
  KvLayout layout;  // valid when `paged`
  // Per-layer regions (RegionSpec.layer_shares; paged, layout.layer_stride == 0): one entry per
  // layout layer. nullptr: a single-base region. Plans keep it alive (Plan::header's
  // SideGeometry.layer_bases points into it).
  std::shared_ptr<const LayerBases> layer_bases;
};

struct PlanOptions {
  // Target bytes per tile (the unit of scheduling, preemption and progress). Rounded down to the
  // plan's access width; at most 1 GiB.
  uint64_t tile_bytes = 1 << 20;
  // Where the plan's block tables live (nullptr: plain heap memory). Not owned; must outlive the
  // call (the tables keep what they need alive afterwards).
  TableAllocator* tables = nullptr;
  // Runs the two sides' copy-and-check (nullptr: one after the other on the calling thread). Not
  // owned; must outlive the call.
  TableCheckRunner* table_checks = nullptr;
  // Block tables of at least this many ids (both sides together) are copied here but their ids
  // are checked (range; destination ids unique) only as tiles start: Plan::CheckTiles, which
  // every engine calls before it runs tiles. 0: every id is checked here. Counts, layers, heads
  // and everything else are always checked here.
  uint64_t defer_checks_from = 0;
  // At most this many tiles per transfer (RESOURCE_EXHAUSTED naming the size field beyond): each
  // tile is an entry in a transfer's record and queues, so a huge count of tiny tiles (a
  // 134M-layer request, a peer asking for 1-byte tiles) would hold memory and a thread for
  // seconds.
  uint64_t max_tiles = uint64_t{1} << 20;
};

class DeferredIdChecks;

struct TileInfo {
  uint32_t layer;  // index within the transfer, 0-based (add src.layer_begin for the source's)
  uint64_t bytes;
};

// A block table read in place (TransferEndpoint.block_table: ids in a client's shared memory)
// instead of the endpoint's block_ids. MakePlan copies the ids once into the plan and validates
// the copy, so memory the client rewrites meanwhile can only change which (checked) blocks move.
// The memory must stay mapped for the call. Errors about the table name `field`
// ("src.block_table").
struct TableRef {
  const uint32_t* ids = nullptr;
  size_t count = 0;
  std::string field;
};
struct TableRefs {
  std::optional<TableRef> src, dst;
};
// A compact plan: a header (geometry, strides, chunking, tiling) and the two block tables actually
// touched. Its size is O(blocks) uint32s; tiles and chunks are computed, never stored.
class Plan {
 public:
  uint64_t bytes_total() const { return header_.bytes_total; }
  uint32_t num_tiles() const { return header_.num_tiles; }
  // Tiles are ordered by layer: all tiles of transfer layer 0, then layer 1, ...
  TileInfo tile(uint32_t i) const;
  uint32_t num_layers() const { return header_.num_layers; }
  // Tiles of each layer (equal for every layer).
  uint32_t tiles_per_layer() const { return header_.num_parts * header_.tiles_per_part; }
  const kernels::PlanHeader& header() const { return header_; }
  // Block-table entries (as many as the tokens need), in token order.
  const BlockTable& src_blocks() const { return src_blocks_; }
  const BlockTable& dst_blocks() const { return dst_blocks_; }
  kernels::ChunkKind chunk_kind() const {
    return static_cast<kernels::ChunkKind>(header_.chunk_kind);
  }
  uint64_t chunk_bytes() const { return header_.chunk_bytes; }
  // Chunks in the whole transfer, and the contiguous copies they merge into (runs of consecutive
  // block ids adjacent on both sides merge; the host twin does exactly these copies when no tile
  // boundary cuts a run).
  uint64_t num_chunks() const;
  uint64_t num_runs() const { return num_runs_; }
  // Whether num_runs() was estimated from the table's first entries (deferred checks).
  bool runs_estimated() const { return runs_estimated_; }
  // One line for humans: chunk size and kind, coalescing, tiles.
  std::string Describe() const;
  // Frees the block tables (src_blocks / dst_blocks become empty; the header and everything
  // computed from it stay). For plans kept after their transfer ended: a 262k-block plan holds
  // 2 MiB, and an ended transfer's record stays in the history long after no tile will run.
  // The memory goes back to its pool once nothing else holds it (BlockTable::Hold).
  void ReleaseBlockTables();

  // Checks the block ids that tiles [begin, end) use, when MakePlan deferred them
  // (PlanOptions::defer_checks_from); OK at once otherwise. An engine must call it before it runs
  // those tiles and run none of them unless it returns OK. Checks go in table order, each id once
  // (a batch of tiles costs the ids it adds); the first error is kept and returned to every later
  // call, so all later tiles fail with it. Its message names the id as MakePlan's would
  // ("spec.dst.block_ids[9]: block 4 repeats spec.dst.block_ids[2]: ..."). Thread-safe.
  absl::Status CheckTiles(uint32_t begin, uint32_t end) const;
  // Whether MakePlan left id checks to CheckTiles.
  bool checks_deferred() const { return checks_ != nullptr; }
  // Whether a side is a per-layer region (its SideGeometry.layer_bases is set).
  bool src_per_layer() const { return header_.src.layer_bases != 0; }
  bool dst_per_layer() const { return header_.dst.layer_bases != 0; }
  // A copy whose per-layer sides read layer addresses from `src` / `dst` instead (nullptr keeps
  // a side's table): the same region's layers as another GPU addresses them
  // (Region::DeviceLayerBases), for the copy engines and the kernel upload. Each table has the
  // region's num_layers entries; the copy keeps both alive.
  Plan WithLayerBases(std::shared_ptr<const LayerBases> src,
                      std::shared_ptr<const LayerBases> dst) const;

 private:
  friend absl::StatusOr<Plan> MakePlan(const kvrail::v1::TransferSpec&, const RegionView&,
                                       const RegionView&, const PlanOptions&, const TableRefs&);
  friend class PlanTemplate;
  Plan() = default;
  // Sets num_runs_ from the tables (the first kRunSampleChunks entries, scaled, when `sampled`).
  void CountRuns(uint64_t src_block_stride, uint64_t dst_block_stride, bool sampled);

  kernels::PlanHeader header_{};
  BlockTable src_blocks_;
  BlockTable dst_blocks_;
  uint64_t num_runs_ = 0;
  bool runs_estimated_ = false;
  // Per-layer sides: the tables header_.{src,dst}.layer_bases point into (nullptr otherwise).
  std::shared_ptr<const LayerBases> src_layer_bases_, dst_layer_bases_;
  // Shared by copies of the plan: the checks are done once whichever copy asks.
  std::shared_ptr<DeferredIdChecks> checks_;
};

// Validates `spec` against both regions and builds the plan. Either side may be a per-layer
// region (RegionView::layer_bases): its SideGeometry.layer_bases then points at the region's
// table, and the access width also divides every layer address the transfer touches. Errors name
// the spec field:
// INVALID_ARGUMENT "spec.src.block_ids[3]: block 9000 out of range [0, 4096)", "spec.num_heads:
// ...", "spec.dst.layer_begin: ...", duplicate destination block ids, too few destination blocks,
// head vector mismatches, bytes ranges outside a region, paged mixed with bytes;
// FAILED_PRECONDITION "spec.dst.region_id: region is not writable".
absl::StatusOr<Plan> MakePlan(const kvrail::v1::TransferSpec& spec, const RegionView& src,
                              const RegionView& dst, const PlanOptions& options);

absl::StatusOr<Plan> MakePlan(const kvrail::v1::TransferSpec& spec, const RegionView& src,
                              const RegionView& dst, const PlanOptions& options,
                              const TableRefs& tables);

// A transfer's shape planned once, for a prepared transfer posted many times with new block ids
// (TransferManager::Prepare): MakePlan's checks of everything but the ids (layouts, layers,
// heads, tokens, strides, tiling) are done by Make, and each post's Instantiate only copies and
// checks its ids (each below its side's num_blocks, the destination's distinct), exactly as
// MakePlan checks them, and counts the contiguous runs. A plan made by Instantiate equals
// MakePlan's for the same spec with those ids. Immutable once made: Instantiate is thread-safe.
class PlanTemplate {
 public:
  // `spec` must carry no block ids (INVALID_ARGUMENT naming spec.src.block_ids / dst); each post
  // gives exactly `src_count` source and `dst_count` destination ids (paged regions; both 0 for
  // bytes regions). dst_count 0: as many as the transfer's tokens need. The counts must be those
  // the tokens use (INVALID_ARGUMENT naming src_block_count / dst_block_count otherwise: with
  // num_tokens 0 every source block's tokens move). Other errors as MakePlan's.
  static absl::StatusOr<PlanTemplate> Make(const kvrail::v1::TransferSpec& spec,
                                           const RegionView& src, const RegionView& dst,
                                           const PlanOptions& options, uint32_t src_count,
                                           uint32_t dst_count);
  uint32_t src_count() const { return src_count_; }
  uint32_t dst_count() const { return dst_count_; }
  // The plan's header and everything computed from it (no block tables).
  const Plan& shape() const { return shape_; }
  // The plan of one post. `src` / `dst` must hold exactly src_count() / dst_count() ids
  // (INVALID_ARGUMENT "<field>: 3 ids, the prepared transfer takes 4"); an id at or beyond its
  // side's num_blocks or a repeated destination id is INVALID_ARGUMENT naming it with the
  // TableRef's field ("post.src_block_ids[3]: block 9000 out of range [0, 4096)"; `field`s
  // here are whole names). options.tables / table_checks / defer_checks_from as for MakePlan.
  absl::StatusOr<Plan> Instantiate(const TableRef& src, const TableRef& dst,
                                   const PlanOptions& options) const;

 private:
  PlanTemplate() = default;
  Plan shape_;
  uint32_t src_count_ = 0, dst_count_ = 0;
  uint32_t src_num_blocks_ = 0, dst_num_blocks_ = 0;
  uint64_t src_block_stride_ = 0, dst_block_stride_ = 0;
  bool paged_ = false;
};

// One contiguous piece of a tile: `bytes` from source offset `src` to destination offset `dst`
// (offsets from each side's kernels::SideBase: the region base, or 0 for a per-layer side whose
// offsets are whole addresses). HostAddress turns one into a pointer.
struct CopyRun {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
};

// The host pointer of offset `offset` of a side whose region base is `base` (ignored for a
// per-layer side). Integer arithmetic: a per-layer side's offsets are whole addresses.
inline uint8_t* HostAddress(const kernels::SideGeometry& g, const void* base, uint64_t offset) {
  return reinterpret_cast<uint8_t*>(kernels::SideBase(g, reinterpret_cast<uintptr_t>(base)) +
                                    offset);
}

// Calls `fn(const CopyRun&)` for tile `tile`'s pieces in order, each the tile's chunks merged for
// as long as both sides continue contiguously. The one walk over a tile shared by the host twin,
// the copy-engine batches and fabric packing (kernels/plan_math.h does the arithmetic).
template <typename Fn>
void ForEachTileRun(const Plan& plan, uint32_t tile, Fn&& fn) {
  namespace k = ::kvrail::kernels;
  const k::PlanHeader& h = plan.header();
  const k::TileDesc t = k::TileAt(h, tile);
  if (static_cast<k::ChunkKind>(h.chunk_kind) == k::ChunkKind::kBytes) {
    fn(CopyRun{h.src.origin + t.byte_begin, h.dst.origin + t.byte_begin,
               t.byte_end - t.byte_begin});
    return;
  }
  const uint32_t* sb = plan.src_blocks().data();
  const uint32_t* db = plan.dst_blocks().data();
  CopyRun run;
  uint64_t pos = t.byte_begin;
  uint32_t c = static_cast<uint32_t>(pos / h.chunk_bytes);
  uint64_t r = pos % h.chunk_bytes;
  const k::LayerSpan layer = k::LayerAt(h, t.layer);  // a tile never spans layers
  while (pos < t.byte_end) {
    const k::ChunkSpan span = k::ChunkAtInLayer(h, sb, db, layer, t.part, c);
    const uint64_t n = std::min(span.bytes - r, t.byte_end - pos);
    const uint64_t s = span.src + r, d = span.dst + r;
    if (run.bytes != 0 && run.src + run.bytes == s && run.dst + run.bytes == d) {
      run.bytes += n;
    } else {
      if (run.bytes != 0) fn(run);
      run = CopyRun{s, d, n};
    }
    pos += n;
    ++c;
    r = 0;
  }
  if (run.bytes != 0) fn(run);
}

// The host twin of the kernel: executes tile `tile` of `plan` with memcpy of coalesced chunks,
// using kernels/plan_math.h. `src_base` / `dst_base` are the region bases; a per-layer side's
// base is ignored (its offsets are whole addresses: kernels::SideBase). Thread-safe for distinct
// tiles (tiles never overlap on the destination).
void ExecuteTileHost(const Plan& plan, uint32_t tile, const uint8_t* src_base, uint8_t* dst_base);

// The integrity digest (TransferSpec.digest; the definition is kernels/digest.h: each byte hashed
// at its logical position, so both sides of a transfer agree whatever their layouts). Host code
// of every path uses these; the CUDA kernels compute the same values (kernels/kv_digest.h).
enum class DigestSide { kSource, kDestination };
// ExecuteTileHost that also hashes the source bytes as it copies them (slice by slice, so the copy
// reads what the hash just cached); returns the tile's source digest.
uint64_t ExecuteTileHostWithDigest(const Plan& plan, uint32_t tile, const uint8_t* src_base,
                                   uint8_t* dst_base);
// The digest of tile `tile`'s bytes on one side, read in place (`base` as for ExecuteTileHost).
uint64_t TileDigestHost(const Plan& plan, uint32_t tile, const uint8_t* base, DigestSide side);
// The digest of a packed tile (the fabric's staging: the tile's bytes in stream order).
uint64_t PackedTileDigest(const Plan& plan, uint32_t tile, const uint8_t* packed);
// DATA_LOSS naming the tile and its layer (source numbering) for a tile whose digests differ:
// "integrity digest mismatch in tile 3 (layer 5): destination digest ... != source digest ...".
absl::Status DigestMismatchError(const Plan& plan, uint32_t tile, uint64_t source,
                                 uint64_t destination);

}  // namespace kvrail::planner
