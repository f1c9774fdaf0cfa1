// MakePlan: request validation, chunk selection (coalescing) and tiling.
#include "daemon/planner/planner.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "daemon/planner/id_checks.h"
#include "kernels/plan_math.h"

namespace kvrail::planner {
namespace {

using Wide = unsigned __int128;
namespace k = ::kvrail::kernels;

// Largest tile; keeps every in-tile offset a 32-bit value for the kernel's fast division.
constexpr uint64_t kMaxTileBytes = uint64_t{1} << 30;
// Largest chunk the kernel can locate with 32-bit arithmetic.
constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 30;
constexpr uint32_t kMaxAccessBytes = 16;
// Chunks whose adjacency is counted when a plan's id checks are deferred (see MakePlan).
constexpr uint64_t kRunSampleChunks = 8192;

absl::Status CheckTileCount(uint64_t tiles, const PlanOptions& options, absl::string_view field) {
  if (options.max_tiles == 0 || tiles <= options.max_tiles) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(field, ": the transfer would be ", tiles,
                                                   " tiles (at most ", options.max_tiles,
                                                   " per transfer); use larger tiles or split it"));
}

std::string DTypeName(int dtype) {
  return kvrail::v1::DType_IsValid(dtype)
             ? kvrail::v1::DType_Name(static_cast<kvrail::v1::DType>(dtype))
             : absl::StrCat(dtype);
}

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, ": ", what));
}

// Largest power of two <= 16 dividing v (v == 0 divides everything).
uint32_t Pow2Divisor(uint64_t v) {
  uint32_t w = kMaxAccessBytes;
  while (w > 1 && v % w != 0) w /= 2;
  return w;
}

// Where one side's block ids are: a shared table (TableRef), block_ids_le32 (little-endian
// uint32, a memcpy to decode instead of a varint per id) or block_ids. `field` names the one used,
// for error messages.
struct IdSource {
  const void* ids = nullptr;  // little-endian uint32s, not necessarily 4-byte aligned
  size_t count = 0;
  std::string field;
  absl::string_view scope = "spec.";  // what errors put before `field`
};

absl::StatusOr<IdSource> FindBlockIds(const kvrail::v1::TransferEndpoint& ep,
                                      absl::string_view side, const std::optional<TableRef>& ref) {
  const std::string& le32 = ep.block_ids_le32();
  if (ref.has_value()) {
    if (ep.block_ids_size() != 0 || !le32.empty()) {
      return Invalid(ref->field, "set one of block_ids, block_ids_le32 and block_table");
    }
    return IdSource{ref->ids, ref->count, ref->field};
  }
  if (!le32.empty()) {
    if (ep.block_ids_size() != 0) {
      return Invalid(absl::StrCat(side, ".block_ids_le32"),
                     "set block_ids or block_ids_le32, not both");
    }
    if (le32.size() % 4 != 0) {
      return Invalid(absl::StrCat(side, ".block_ids_le32"),
                     absl::StrCat(le32.size(), " bytes is not a whole number of uint32 ids"));
    }
    // x86-64 and aarch64 are little-endian.
    return IdSource{le32.data(), le32.size() / 4, absl::StrCat(side, ".block_ids_le32")};
  }
  return IdSource{ep.block_ids().data(), static_cast<size_t>(ep.block_ids_size()),
                  absl::StrCat(side, ".block_ids")};
}

// Copies one side's ids into a table from `tables` and, with `check`, checks the copy: in range,
// and (for the destination) unique. What is checked is the copy: the caller's ids may sit in a
// client's shared memory, which the client may rewrite.
absl::StatusOr<BlockTable> CopyBlockIds(const IdSource& from, uint32_t num_blocks, bool unique,
                                        bool check, TableAllocator* tables) {
  BlockTable ids = BlockTable::Allocate(from.count, tables);
  if (!ids.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        from.scope, from.field, ": no memory for a table of ", from.count, " block ids"));
  }
  if (from.count > 0) std::memcpy(ids.data(), from.ids, 4 * from.count);
  if (check) {
    SeenBlocks seen;
    if (unique) seen.assign((static_cast<size_t>(num_blocks) + 63) / 64, 0);
    KVRAIL_RETURN_IF_ERROR(CheckIds(ids.data(), 0, from.count, num_blocks, unique ? &seen : nullptr,
                                    from.scope, from.field));
  }
  return ids;
}

// Both sides' tables; the source's error first, as a serial check would report. With `check`
// false the ids are only copied (deferred checks). A `runner` may do the two sides at once (it
// gets both, so a bad source id no longer spares the destination's check; the answer is the
// same).
absl::Status CopyBothSides(const IdSource& src_from, uint32_t src_blocks, const IdSource& dst_from,
                           uint32_t dst_blocks, bool check, const PlanOptions& options,
                           BlockTable* src_ids, BlockTable* dst_ids) {
  absl::StatusOr<BlockTable> src, dst;
  if (check && options.table_checks != nullptr) {
    options.table_checks->RunBoth(
        src_from.count + dst_from.count,
        [&] { src = CopyBlockIds(src_from, src_blocks, false, true, options.tables); },
        [&] { dst = CopyBlockIds(dst_from, dst_blocks, true, true, options.tables); });
  } else {
    src = CopyBlockIds(src_from, src_blocks, false, check, options.tables);
    if (src.ok()) dst = CopyBlockIds(dst_from, dst_blocks, true, check, options.tables);
  }
  KVRAIL_RETURN_IF_ERROR(src.status());
  KVRAIL_RETURN_IF_ERROR(dst.status());
  *src_ids = *std::move(src);
  *dst_ids = *std::move(dst);
  return absl::OkStatus();
}

k::SideGeometry Side(const KvLayout& lay, uint32_t layer_begin, uint32_t head_begin,
                     size_t table_blocks) {
  k::SideGeometry g{};
  g.origin = lay.offset + layer_begin * lay.layer_stride + head_begin * lay.head_stride;
  g.layer_stride = lay.layer_stride;
  g.part_stride = lay.part_stride;
  g.block_stride = lay.block_stride;
  g.token_stride = lay.token_stride;
  g.head_stride = lay.head_stride;
  g.tokens_per_block = k::MakeFastDiv(lay.tokens_per_block);
  g.num_table_blocks = static_cast<uint32_t>(table_blocks);
  g.layer_begin = layer_begin;
  g.head_begin = head_begin;
  return g;
}

// Per-layer regions: points `g` at the region's table of layer addresses and keeps it in `keep`.
// The table has one entry per layout layer (regions/ builds it so; checked, not assumed).
absl::Status AttachLayerBases(const RegionView& view, absl::string_view side, k::SideGeometry& g,
                              std::shared_ptr<const LayerBases>* keep) {
  if (view.layer_bases == nullptr) return absl::OkStatus();
  if (view.layer_bases->size() != view.layout.num_layers || view.layout.layer_stride != 0) {
    return absl::InternalError(absl::StrCat("spec.", side, ".region_id: per-layer region with ",
                                            view.layer_bases->size(), " layer bases for ",
                                            view.layout.num_layers, " layers"));
  }
  g.layer_bases = reinterpret_cast<uint64_t>(view.layer_bases->data());
  *keep = view.layer_bases;
  return absl::OkStatus();
}

void FinishTiling(k::PlanHeader& h, uint64_t tile_bytes) {
  uint64_t t = std::min<uint64_t>(std::max<uint64_t>(tile_bytes, 1), kMaxTileBytes);
  t = std::max<uint64_t>(t - t % h.access_bytes, h.access_bytes);
  h.tile_bytes = t;
  h.tiles_per_part = static_cast<uint32_t>((h.part_bytes + t - 1) / t);
}

}  // namespace

TileInfo Plan::tile(uint32_t i) const {
  const k::TileDesc d = k::TileAt(header_, i);
  return TileInfo{d.layer, d.byte_end - d.byte_begin};
}

void Plan::ReleaseBlockTables() {
  src_blocks_ = BlockTable();
  dst_blocks_ = BlockTable();
  checks_.reset();  // it holds the tables too
}

absl::Status Plan::CheckTiles(uint32_t begin, uint32_t end) const {
  if (checks_ == nullptr || begin >= end) return absl::OkStatus();
  // Entries each side's table needs for tiles up to `end - 1`. Within one (layer, part) stream a
  // later tile reads later tokens; a range that crosses into the next stream has read a whole
  // stream, so it needs every entry.
  size_t src_need = SIZE_MAX, dst_need = SIZE_MAX;
  if (begin / header_.tiles_per_part == (end - 1) / header_.tiles_per_part) {
    const k::TileDesc last = k::TileAt(header_, end - 1);
    const uint64_t head_run = uint64_t{header_.num_heads} * header_.vector_bytes;
    const uint64_t last_token = (last.byte_end - 1) / head_run;
    src_need = last_token / header_.src.tokens_per_block.divisor + 1;
    dst_need = last_token / header_.dst.tokens_per_block.divisor + 1;
  }
  return checks_->Through(src_need, dst_need);
}

uint64_t Plan::num_chunks() const {
  return k::ChunksPerPart(header_) * header_.num_layers * header_.num_parts;
}

std::string Plan::Describe() const {
  const char* kind = "bytes";
  switch (chunk_kind()) {
    case k::ChunkKind::kBytes:
      kind = "bytes range";
      break;
    case k::ChunkKind::kHeadVector:
      kind = "head vector";
      break;
    case k::ChunkKind::kTokenHeads:
      kind = "token (heads merged)";
      break;
    case k::ChunkKind::kBlockTokens:
      kind = "block (tokens merged)";
      break;
  }
  return absl::StrFormat(
      "%d B over %d layers x %d parts; chunk %d B (%s), %d chunks -> %s%d contiguous runs; "
      "%d-byte accesses; %d tiles of <= %d B (%d per layer); tables %d src + %d dst blocks%s",
      header_.bytes_total, header_.num_layers, header_.num_parts, header_.chunk_bytes, kind,
      num_chunks(), runs_estimated_ ? "~" : "", num_runs_, header_.access_bytes, header_.num_tiles,
      header_.tile_bytes, tiles_per_layer(), src_blocks_.size(), dst_blocks_.size(),
      checks_ != nullptr ? " (ids checked as tiles start)" : "");
}

void Plan::CountRuns(uint64_t src_block_stride, uint64_t dst_block_stride, bool defer) {
  Plan* plan = this;
  const k::PlanHeader& h = plan->header_;
  // Contiguous runs: whole blocks whose ids are consecutive on both sides merge when blocks are
  // packed back to back on both sides.
  const uint64_t per_part_chunks = k::ChunksPerPart(h);
  uint64_t runs_per_part = per_part_chunks;
  if (static_cast<k::ChunkKind>(h.chunk_kind) == k::ChunkKind::kBlockTokens &&
      src_block_stride == h.chunk_bytes && dst_block_stride == h.chunk_bytes) {
    // With deferred checks the submit's own work should not grow with the table: the breaks
    // are counted over the first kRunSampleChunks entries and scaled (the count only chooses
    // copy engines for long runs and feeds Describe).
    const uint64_t counted =
        defer ? std::min<uint64_t>(per_part_chunks, kRunSampleChunks) : per_part_chunks;
    const BlockTable& sb = plan->src_blocks_;
    const BlockTable& db = plan->dst_blocks_;
    uint64_t breaks = 0;
    for (uint64_t j = 1; j < counted; ++j) {
      const bool adjacent = sb[j] == sb[j - 1] + 1 && db[j] == db[j - 1] + 1;
      if (!adjacent) ++breaks;
    }
    plan->runs_estimated_ = false;
    if (counted < per_part_chunks) {
      plan->runs_estimated_ = true;
      breaks = static_cast<uint64_t>(static_cast<double>(breaks) * (per_part_chunks - 1) /
                                         static_cast<double>(counted - 1) +
                                     0.5);
    }
    runs_per_part = per_part_chunks == 0 ? 0 : 1 + breaks;
  }
  plan->num_runs_ = runs_per_part * h.num_layers * h.num_parts;
}

absl::StatusOr<Plan> MakePlan(const kvrail::v1::TransferSpec& spec, const RegionView& src,
                              const RegionView& dst, const PlanOptions& options) {
  return MakePlan(spec, src, dst, options, TableRefs{});
}

absl::StatusOr<Plan> MakePlan(const kvrail::v1::TransferSpec& spec, const RegionView& src,
                              const RegionView& dst, const PlanOptions& options,
                              const TableRefs& tables) {
  if (!dst.writable) {
    return absl::FailedPreconditionError("spec.dst.region_id: region is not writable");
  }
  if (src.paged != dst.paged) {
    return Invalid("dst.region_id",
                   absl::StrCat("source is a ", src.paged ? "paged KV" : "bytes",
                                " region but destination is a ", dst.paged ? "paged KV" : "bytes",
                                " region; they cannot be mixed"));
  }
  Plan plan;
  k::PlanHeader& h = plan.header_;

  if (!src.paged) {
    const uint64_t n = spec.num_bytes();
    if (n == 0) return Invalid("num_bytes", "must be > 0 for bytes regions");
    if (Wide{spec.src().byte_offset()} + n > src.size_bytes) {
      return Invalid("src.byte_offset",
                     absl::StrCat("range [", spec.src().byte_offset(), ", +", n,
                                  ") exceeds the region's ", src.size_bytes, " bytes"));
    }
    if (Wide{spec.dst().byte_offset()} + n > dst.size_bytes) {
      return Invalid("dst.byte_offset",
                     absl::StrCat("range [", spec.dst().byte_offset(), ", +", n,
                                  ") exceeds the region's ", dst.size_bytes, " bytes"));
    }
    h.src.origin = spec.src().byte_offset();
    h.dst.origin = spec.dst().byte_offset();
    h.src.tokens_per_block = h.dst.tokens_per_block = k::MakeFastDiv(1);
    h.chunk_kind = static_cast<uint32_t>(k::ChunkKind::kBytes);
    h.num_layers = h.num_parts = h.num_heads = 1;
    h.num_tokens = 1;
    h.vector_bytes = 1;
    h.chunk_bytes = h.part_bytes = h.bytes_total = n;
    h.access_bytes = Pow2Divisor(h.src.origin | h.dst.origin | n);
    h.chunk_div = k::MakeFastDiv(1);
    h.heads_div = k::MakeFastDiv(1);
    FinishTiling(h, options.tile_bytes);
    KVRAIL_RETURN_IF_ERROR(CheckTileCount(h.tiles_per_part, options, "spec.num_bytes"));
    h.num_tiles = h.tiles_per_part;
    plan.num_runs_ = 1;
    return plan;
  }

  const KvLayout& s = src.layout;
  const KvLayout& d = dst.layout;
  const auto& se = spec.src();
  const auto& de = spec.dst();
  if (s.head_dim != d.head_dim || s.dtype_bytes != d.dtype_bytes) {
    return Invalid(
        "dst.region_id",
        absl::StrCat("head vectors differ: source head_dim ", s.head_dim, " x ", s.dtype_bytes,
                     " B, destination head_dim ", d.head_dim, " x ", d.dtype_bytes, " B"));
  }
  if (s.dtype != d.dtype && !spec.reinterpret_dtype()) {
    return Invalid("reinterpret_dtype",
                   absl::StrCat("the source's paged_kv.dtype is ", DTypeName(s.dtype),
                                ", the destination's ", DTypeName(d.dtype),
                                "; bytes are moved, not converted: set reinterpret_dtype to move "
                                "them unconverted"));
  }
  if (s.num_parts != d.num_parts) {
    return Invalid("dst.region_id", absl::StrCat("source has ", s.num_parts,
                                                 " parts per layer, destination ", d.num_parts));
  }
  // Layers.
  if (se.layer_begin() >= s.num_layers) {
    return Invalid("src.layer_begin",
                   absl::StrCat(se.layer_begin(), " out of range [0, ", s.num_layers, ")"));
  }
  const uint32_t layers =
      spec.num_layers() != 0 ? spec.num_layers() : s.num_layers - se.layer_begin();
  if (uint64_t{se.layer_begin()} + layers > s.num_layers) {
    return Invalid("num_layers", absl::StrCat("layers [", se.layer_begin(), ", +", layers,
                                              ") exceed the source's ", s.num_layers));
  }
  if (uint64_t{de.layer_begin()} + layers > d.num_layers) {
    return Invalid("dst.layer_begin", absl::StrCat("layers [", de.layer_begin(), ", +", layers,
                                                   ") exceed the destination's ", d.num_layers));
  }
  // Heads.
  if (se.head_begin() >= s.num_heads) {
    return Invalid("src.head_begin",
                   absl::StrCat(se.head_begin(), " out of range [0, ", s.num_heads, ")"));
  }
  const uint32_t heads = spec.num_heads() != 0 ? spec.num_heads() : s.num_heads - se.head_begin();
  if (uint64_t{se.head_begin()} + heads > s.num_heads) {
    return Invalid("num_heads", absl::StrCat("heads [", se.head_begin(), ", +", heads,
                                             ") exceed the source's ", s.num_heads));
  }
  if (uint64_t{de.head_begin()} + heads > d.num_heads) {
    return Invalid("dst.head_begin", absl::StrCat("heads [", de.head_begin(), ", +", heads,
                                                  ") exceed the destination's ", d.num_heads));
  }
  // Blocks and tokens.
  KVRAIL_ASSIGN_OR_RETURN(const IdSource src_from, FindBlockIds(se, "src", tables.src));
  KVRAIL_ASSIGN_OR_RETURN(const IdSource dst_from, FindBlockIds(de, "dst", tables.dst));
  if (src_from.count == 0) return Invalid("src.block_ids", "empty");
  BlockTable src_ids, dst_ids;
  const bool defer =
      options.defer_checks_from > 0 && src_from.count + dst_from.count >= options.defer_checks_from;
  KVRAIL_RETURN_IF_ERROR(CopyBothSides(src_from, s.num_blocks, dst_from, d.num_blocks, !defer,
                                       options, &src_ids, &dst_ids));
  const std::string& dst_field = dst_from.field;
  const uint64_t src_capacity =
      uint64_t{static_cast<uint32_t>(src_ids.size())} * s.tokens_per_block;
  const uint64_t tokens = spec.num_tokens() != 0 ? spec.num_tokens() : src_capacity;
  if (tokens > src_capacity) {
    return Invalid("num_tokens",
                   absl::StrCat(tokens, " tokens need ",
                                (tokens + s.tokens_per_block - 1) / s.tokens_per_block,
                                " source blocks, ", src_ids.size(), " given"));
  }
  if (Wide{tokens} * heads > k::kFastDivMaxDividend) {
    return Invalid("num_tokens",
                   absl::StrCat(tokens, " tokens x ", heads,
                                " heads is too many for one transfer (max 2^31 - 1); split it"));
  }
  const uint64_t src_used = (tokens + s.tokens_per_block - 1) / s.tokens_per_block;
  const uint64_t dst_used = (tokens + d.tokens_per_block - 1) / d.tokens_per_block;
  if (static_cast<uint64_t>(dst_ids.size()) < dst_used) {
    return Invalid(dst_field,
                   absl::StrCat(tokens, " tokens need ", dst_used, " destination blocks of ",
                                d.tokens_per_block, " tokens, ", dst_ids.size(), " given"));
  }

  if (defer) {
    plan.checks_ = std::make_shared<DeferredIdChecks>(
        DeferredSide{src_ids.Hold(), src_ids.data(), src_used, src_ids.size(), s.num_blocks, false,
                     src_from.field},
        DeferredSide{dst_ids.Hold(), dst_ids.data(), dst_used, dst_ids.size(), d.num_blocks, true,
                     dst_from.field});
  }
  src_ids.Truncate(src_used);
  dst_ids.Truncate(dst_used);
  plan.src_blocks_ = std::move(src_ids);
  plan.dst_blocks_ = std::move(dst_ids);
  h.src = Side(s, se.layer_begin(), se.head_begin(), src_used);
  h.dst = Side(d, de.layer_begin(), de.head_begin(), dst_used);
  KVRAIL_RETURN_IF_ERROR(AttachLayerBases(src, "src", h.src, &plan.src_layer_bases_));
  KVRAIL_RETURN_IF_ERROR(AttachLayerBases(dst, "dst", h.dst, &plan.dst_layer_bases_));
  h.num_layers = layers;
  h.num_parts = s.num_parts;
  h.num_heads = heads;
  h.num_tokens = tokens;
  h.heads_div = k::MakeFastDiv(heads);
  const uint64_t vec = uint64_t{s.head_dim} * s.dtype_bytes;
  h.vector_bytes = static_cast<uint32_t>(vec);
  const uint64_t head_run = vec * heads;
  h.part_bytes = tokens * head_run;
  h.bytes_total = h.part_bytes * layers * h.num_parts;

  // Coalescing: the largest unit contiguous on both sides.
  const bool heads_merge = heads == 1 || (s.head_stride == vec && d.head_stride == vec);
  const bool tokens_merge = heads_merge && s.tokens_per_block == d.tokens_per_block &&
                            s.tokens_per_block > 1 && s.token_stride == head_run &&
                            d.token_stride == head_run &&
                            head_run * s.tokens_per_block <= kMaxChunkBytes;
  k::ChunkKind kind = k::ChunkKind::kHeadVector;
  uint64_t chunk = vec;
  if (tokens_merge) {
    kind = k::ChunkKind::kBlockTokens;
    chunk = head_run * s.tokens_per_block;
  } else if (heads_merge && head_run <= kMaxChunkBytes) {
    kind = k::ChunkKind::kTokenHeads;
    chunk = head_run;
  }
  h.chunk_kind = static_cast<uint32_t>(kind);
  h.chunk_bytes = chunk;
  h.chunk_div = k::MakeFastDiv(static_cast<uint32_t>(chunk));

  // Access width: divides every chunk length and start on both sides (tile cuts are rounded to
  // it below). Only strides of dimensions that vary matter.
  uint64_t bits = vec | h.src.origin | h.dst.origin;
  for (const auto* g : {&h.src, &h.dst}) {
    // Per-layer sides: every layer address the transfer touches (an odd base narrows the width).
    for (uint32_t l = 0; g->layer_bases != 0 && l < layers; ++l) bits |= k::LayerOffset(*g, l);
    if (layers > 1) bits |= g->layer_stride;
    if (h.num_parts > 1) bits |= g->part_stride;
    bits |= g->block_stride | g->token_stride;
    if (heads > 1) bits |= g->head_stride;
  }
  h.access_bytes = Pow2Divisor(bits);
  FinishTiling(h, options.tile_bytes);
  const Wide tiles = Wide{h.tiles_per_part} * layers * h.num_parts;
  if (tiles > UINT32_MAX) {
    return Invalid("num_tokens",
                   "the transfer needs more than 2^32 tiles; raise the tile size or split it");
  }
  KVRAIL_RETURN_IF_ERROR(CheckTileCount(static_cast<uint64_t>(tiles), options, "spec.num_tokens"));
  h.num_tiles = static_cast<uint32_t>(tiles);

  plan.CountRuns(s.block_stride, d.block_stride, defer);
  return plan;
}

Plan Plan::WithLayerBases(std::shared_ptr<const LayerBases> src,
                          std::shared_ptr<const LayerBases> dst) const {
  Plan copy = *this;
  if (src != nullptr && src_per_layer()) {
    copy.header_.src.layer_bases = reinterpret_cast<uint64_t>(src->data());
    copy.src_layer_bases_ = std::move(src);
  }
  if (dst != nullptr && dst_per_layer()) {
    copy.header_.dst.layer_bases = reinterpret_cast<uint64_t>(dst->data());
    copy.dst_layer_bases_ = std::move(dst);
  }
  return copy;
}

}  // namespace kvrail::planner

namespace kvrail::planner {
namespace {

// The most ids a prepared transfer's side may take per post (64 MiB of ids, as a request's
// table: transfers/resolve.h kMaxTableIds).
constexpr uint64_t kMaxTemplateIds = uint64_t{1} << 24;

absl::Status CheckNoIds(const kvrail::v1::TransferEndpoint& ep, absl::string_view side) {
  if (ep.block_ids_size() == 0 && ep.block_ids_le32().empty() && !ep.has_block_table()) {
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat(side, ".block_ids"),
                 "a prepared transfer's block ids come with each post; prepare it without ids");
}

}  // namespace

absl::StatusOr<PlanTemplate> PlanTemplate::Make(const kvrail::v1::TransferSpec& spec,
                                                const RegionView& src, const RegionView& dst,
                                                const PlanOptions& options, uint32_t src_count,
                                                uint32_t dst_count) {
  KVRAIL_RETURN_IF_ERROR(CheckNoIds(spec.src(), "src"));
  KVRAIL_RETURN_IF_ERROR(CheckNoIds(spec.dst(), "dst"));
  PlanOptions whole = options;
  whole.defer_checks_from = 0;
  PlanTemplate t;
  if (!src.paged || !dst.paged) {
    KVRAIL_ASSIGN_OR_RETURN(t.shape_, MakePlan(spec, src, dst, whole));
    if (src_count != 0 || dst_count != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(src_count != 0 ? "src_block_count" : "dst_block_count",
                       ": a transfer between bytes regions takes no block ids"));
    }
    return t;
  }
  if (src_count == 0) {
    return absl::InvalidArgumentError(
        "src_block_count: must be > 0: the source block ids each post gives (paged regions)");
  }
  if (src_count > kMaxTemplateIds || dst_count > kMaxTemplateIds) {
    return absl::InvalidArgumentError(
        absl::StrCat(src_count > kMaxTemplateIds ? "src_block_count" : "dst_block_count",
                     ": at most ", kMaxTemplateIds, " ids per side"));
  }
  const uint64_t tokens = spec.num_tokens() != 0
                              ? spec.num_tokens()
                              : uint64_t{src_count} * src.layout.tokens_per_block;
  const uint64_t dst_need =
      (tokens + dst.layout.tokens_per_block - 1) / std::max(1u, dst.layout.tokens_per_block);
  if (dst_count == 0) dst_count = static_cast<uint32_t>(std::min<uint64_t>(dst_need, UINT32_MAX));
  if (dst_count > dst.layout.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("dst_block_count: ", dst_count,
                     " distinct destination blocks per post, the destination "
                     "has ",
                     dst.layout.num_blocks));
  }
  // Stand-in ids, valid on both sides (the destination's distinct): every check but the ids'.
  std::vector<uint32_t> src_ids(src_count, 0), dst_ids(dst_count);
  std::iota(dst_ids.begin(), dst_ids.end(), 0u);
  TableRefs refs;
  refs.src = TableRef{src_ids.data(), src_ids.size(), "src_block_count"};
  refs.dst = TableRef{dst_ids.data(), dst_ids.size(), "dst_block_count"};
  KVRAIL_ASSIGN_OR_RETURN(t.shape_, MakePlan(spec, src, dst, whole, refs));
  if (t.shape_.src_blocks().size() != src_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "src_block_count: ", src_count, " ids, but the transfer's ", tokens, " tokens use ",
        t.shape_.src_blocks().size(), " source blocks; give that many"));
  }
  if (t.shape_.dst_blocks().size() != dst_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dst_block_count: ", dst_count, " ids, but the transfer's ", tokens, " tokens use ",
        t.shape_.dst_blocks().size(), " destination blocks; give that many (or 0)"));
  }
  t.shape_.ReleaseBlockTables();
  t.paged_ = true;
  t.src_count_ = src_count;
  t.dst_count_ = dst_count;
  t.src_num_blocks_ = src.layout.num_blocks;
  t.dst_num_blocks_ = dst.layout.num_blocks;
  t.src_block_stride_ = src.layout.block_stride;
  t.dst_block_stride_ = dst.layout.block_stride;
  return t;
}

absl::StatusOr<Plan> PlanTemplate::Instantiate(const TableRef& src, const TableRef& dst,
                                               const PlanOptions& options) const {
  for (const auto& [ref, want] : {std::pair{&src, src_count_}, std::pair{&dst, dst_count_}}) {
    if (ref->count != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(ref->field, ": ", ref->count, " ids, the prepared transfer takes ", want));
    }
  }
  Plan plan = shape_;
  if (!paged_) return plan;
  const IdSource src_from{src.ids, src.count, src.field, ""};
  const IdSource dst_from{dst.ids, dst.count, dst.field, ""};
  const bool defer =
      options.defer_checks_from > 0 && src.count + dst.count >= options.defer_checks_from;
  BlockTable src_ids, dst_ids;
  KVRAIL_RETURN_IF_ERROR(CopyBothSides(src_from, src_num_blocks_, dst_from, dst_num_blocks_, !defer,
                                       options, &src_ids, &dst_ids));
  if (defer) {
    plan.checks_ = std::make_shared<DeferredIdChecks>(
        DeferredSide{src_ids.Hold(), src_ids.data(), src_count_, src_count_, src_num_blocks_, false,
                     src.field, ""},
        DeferredSide{dst_ids.Hold(), dst_ids.data(), dst_count_, dst_count_, dst_num_blocks_, true,
                     dst.field, ""});
  }
  plan.src_blocks_ = std::move(src_ids);
  plan.dst_blocks_ = std::move(dst_ids);
  plan.CountRuns(src_block_stride_, dst_block_stride_, defer);
  return plan;
}

}  // namespace kvrail::planner
