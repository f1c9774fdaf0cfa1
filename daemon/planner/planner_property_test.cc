// Randomized property tests: for many random layouts and transfers, executing every tile of the
// plan with the host twin (in random order) writes exactly what the naive reference writes, and
// nothing else (the destination is poisoned with 0xAB).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/plan_math.h"

namespace kvrail::planner {
namespace {

constexpr uint8_t kPoison = 0xAB;

// Plans whose warp path (plan_math.h: PieceBytesFor) was checked, across all cases.
int g_piece_plans = 0;

// The kernel's warp path on the host: every piece of every tile copied with PieceAt. Pieces must
// stay inside one chunk, so this writes what the reference writes only if the decomposition is
// right.
void ExecuteTilePieces(const Plan& plan, uint32_t tile, uint32_t piece_bytes, const uint8_t* src,
                       uint8_t* dst) {
  const kernels::PlanHeader& h = plan.header();
  const kernels::TileDesc t = kernels::TileAt(h, tile);
  REQUIRE(h.tile_bytes % piece_bytes == 0);
  for (uint64_t k = 0; k < h.tile_bytes / piece_bytes; ++k) {
    const kernels::ChunkSpan p =
        kernels::PieceAt(h, plan.src_blocks().data(), plan.dst_blocks().data(), t, k, piece_bytes);
    REQUIRE(p.bytes <= piece_bytes);
    REQUIRE(p.bytes % 16 == 0);
    if (p.bytes == 0) continue;  // an empty piece may have no address (memcpy of null: UB)
    std::memcpy(HostAddress(h.dst, dst, p.dst), HostAddress(h.src, src, p.src), p.bytes);
  }
}

// Runs one case; returns false (with a message) on the first mismatch.
void CheckCase(const testing::RandomCase& c, std::mt19937_64& rng) {
  INFO(c.ToString());
  absl::StatusOr<Plan> plan = MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  INFO(plan->Describe());

  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> got(c.dst.size_bytes, kPoison);
  std::vector<uint8_t> want(c.dst.size_bytes, kPoison);
  testing::ReferenceCopy(c, src.data(), want.data());

  // Tiles: bytes add up, layers are non-decreasing, every tile is non-empty.
  uint64_t sum = 0;
  uint32_t last_layer = 0;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    const TileInfo info = plan->tile(t);
    REQUIRE(info.bytes > 0);
    REQUIRE(info.layer >= last_layer);
    REQUIRE(info.layer < plan->num_layers());
    last_layer = info.layer;
    sum += info.bytes;
  }
  REQUIRE(sum == plan->bytes_total());
  REQUIRE(plan->tiles_per_layer() * plan->num_layers() == plan->num_tiles());

  std::vector<uint32_t> order(plan->num_tiles());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (uint32_t t : order) ExecuteTileHost(*plan, t, src.data(), got.data());

  if (got != want) {
    size_t first = 0;
    while (got[first] == want[first]) ++first;
    FAIL("first mismatch at dst byte " << first << ": got " << int(got[first]) << " want "
                                       << int(want[first]));
  }
  const uint32_t piece = kernels::PieceBytesFor(plan->header(), plan->header().access_bytes);
  if (piece != 0) {
    ++g_piece_plans;
    std::vector<uint8_t> pieces(c.dst.size_bytes, kPoison);
    for (uint32_t t : order) ExecuteTilePieces(*plan, t, piece, src.data(), pieces.data());
    REQUIRE(pieces == want);
  }
  // The reference writes exactly bytes_total bytes; everything else still holds the poison.
  const uint64_t touched =
      std::count_if(want.begin(), want.end(), [](uint8_t b) { return b != kPoison; });
  REQUIRE(touched <= plan->bytes_total());
}

// Cases with a per-layer side (testing::MakePerLayer): that side's plan offsets are whole
// addresses into its arena, so the reference writes first, its result is kept, the destination
// memory is poisoned again, and the host twin (tiles in random order) and the warp-path pieces
// must each write exactly those bytes, gaps between layers included.
void CheckPerLayerCase(const testing::RandomCase& c, std::mt19937_64& rng) {
  INFO(c.ToString());
  absl::StatusOr<Plan> plan = MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  INFO(plan->Describe());
  const kernels::PlanHeader& h = plan->header();
  REQUIRE((h.src.layer_bases != 0) == (c.src.layer_bases != nullptr));
  REQUIRE((h.dst.layer_bases != 0) == (c.dst.layer_bases != nullptr));
  // The access width divides every layer address the transfer touches.
  for (uint32_t l = 0; l < h.num_layers; ++l) {
    REQUIRE(kernels::LayerOffset(h.src, l) % h.access_bytes == 0);
    REQUIRE(kernels::LayerOffset(h.dst, l) % h.access_bytes == 0);
  }
  std::vector<uint8_t> src_own(c.src_arena ? 0 : c.src.size_bytes);
  std::vector<uint8_t>& src = c.src_arena ? *c.src_arena : src_own;
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> dst_own(c.dst_arena ? 0 : c.dst.size_bytes);
  std::vector<uint8_t>& dst = c.dst_arena ? *c.dst_arena : dst_own;
  std::fill(dst.begin(), dst.end(), kPoison);
  testing::ReferenceCopy(c, src.data(), dst.data());
  const std::vector<uint8_t> want = dst;

  std::fill(dst.begin(), dst.end(), kPoison);
  std::vector<uint32_t> order(plan->num_tiles());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (uint32_t t : order) ExecuteTileHost(*plan, t, src.data(), dst.data());
  if (dst != want) {
    size_t first = 0;
    while (dst[first] == want[first]) ++first;
    FAIL("first mismatch at dst byte " << first << ": got " << int(dst[first]) << " want "
                                       << int(want[first]));
  }
  const uint32_t piece = kernels::PieceBytesFor(h, h.access_bytes);
  if (piece != 0) {
    ++g_piece_plans;
    std::fill(dst.begin(), dst.end(), kPoison);
    for (uint32_t t : order) ExecuteTilePieces(*plan, t, piece, src.data(), dst.data());
    REQUIRE(dst == want);
  }
}

}  // namespace

TEST_CASE("per-layer regions: random cases, either side or both, == naive reference") {
  std::mt19937_64 rng(20261201);
  int sides[3] = {0, 0, 0};  // src only, dst only, both
  int narrowed = 0;          // plans whose width the layer bases narrowed below 16
  for (int n = 0; n < 400; ++n) {
    testing::RandomCase c = testing::RandomPagedCase(rng);
    const int which = n % 3;
    if (which != 1) testing::MakePerLayer(c, /*dst_side=*/false, rng);
    if (which != 0) testing::MakePerLayer(c, /*dst_side=*/true, rng);
    ++sides[which];
    CheckPerLayerCase(c, rng);
    const absl::StatusOr<Plan> plan = MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    // Would the same case with single-base sides have been wider?
    uint64_t bits = 0;
    for (uint32_t l = 0; l < plan->num_layers(); ++l) {
      bits |=
          kernels::LayerOffset(plan->header().src, l) | kernels::LayerOffset(plan->header().dst, l);
    }
    if (bits % 16 != 0) ++narrowed;
  }
  CHECK(sides[0] > 0);
  CHECK(sides[1] > 0);
  CHECK(sides[2] > 0);
  CHECK(narrowed > 100);  // odd-aligned layer bases are exercised
}

TEST_CASE("per-layer serving layouts (vLLM tensors per layer): warp path == reference") {
  std::mt19937_64 rng(12);
  const int before = g_piece_plans;
  for (int n = 0; n < 90; ++n) {
    testing::RandomCase c = testing::RandomServingCase(rng);
    if (n % 3 != 1) testing::MakePerLayer(c, /*dst_side=*/false, rng);
    if (n % 3 != 0) testing::MakePerLayer(c, /*dst_side=*/true, rng);
    CheckPerLayerCase(c, rng);
  }
  CHECK(g_piece_plans - before > 0);
}

TEST_CASE("per-layer regions: layer ranges pick table entries layer_begin + l") {
  // Source: 4 layers per-layer; destination single-base with 6 layers; move source layers
  // [1, 3) to destination layers [3, 5).
  std::mt19937_64 rng(3);
  testing::RandomCase c;
  c.src_layout.set_num_layers(4);
  c.src_layout.set_num_parts(2);
  c.src_layout.set_num_blocks(6);
  c.src_layout.set_tokens_per_block(4);
  c.src_layout.set_num_heads(2);
  c.src_layout.set_head_dim(8);
  c.src_layout.set_dtype(kvrail::v1::DTYPE_BF16);
  c.src_layout.set_order(kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  c.dst_layout = c.src_layout;
  c.dst_layout.set_num_layers(6);
  c.dst_layout.set_order(kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND);
  const uint64_t dst_size = 6ull * 2 * 6 * 4 * 2 * 16;
  c.src = RegionView{1, false, true, {}};
  c.dst = RegionView{dst_size, true, true, *ResolveLayout(c.dst_layout, dst_size, "")};
  testing::MakePerLayer(c, /*dst_side=*/false, rng);
  for (uint32_t b : {5u, 0u, 3u}) c.spec.mutable_src()->add_block_ids(b);
  for (uint32_t b : {2u, 4u, 1u}) c.spec.mutable_dst()->add_block_ids(b);
  c.spec.mutable_src()->set_layer_begin(1);
  c.spec.mutable_dst()->set_layer_begin(3);
  c.spec.set_num_layers(2);
  c.options.tile_bytes = 100;
  CheckPerLayerCase(c, rng);
  const absl::StatusOr<Plan> plan = MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  CHECK(kernels::LayerOffset(plan->header().src, 0) == (*c.src.layer_bases)[1]);
  CHECK(kernels::LayerOffset(plan->header().src, 1) == (*c.src.layer_bases)[2]);
  // And the reverse: single-base source into a per-layer destination.
  testing::RandomCase r;
  r.src_layout = c.dst_layout;
  r.dst_layout = c.src_layout;
  r.src = RegionView{dst_size, false, true, *ResolveLayout(r.src_layout, dst_size, "")};
  r.dst = RegionView{1, true, true, {}};
  testing::MakePerLayer(r, /*dst_side=*/true, rng);
  r.spec = c.spec;
  r.spec.mutable_src()->set_layer_begin(3);
  r.spec.mutable_dst()->set_layer_begin(1);
  CheckPerLayerCase(r, rng);
}

TEST_CASE("random paged transfers: host twin == naive reference") {
  std::mt19937_64 rng(20261129);
  int kinds[4] = {0, 0, 0, 0};
  for (int n = 0; n < 400; ++n) {
    testing::RandomCase c = testing::RandomPagedCase(rng);
    absl::StatusOr<Plan> plan = MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    ++kinds[static_cast<int>(plan->chunk_kind())];
    CheckCase(c, rng);
  }
  // The generator reaches every paged chunk kind.
  CHECK(kinds[1] > 0);
  CHECK(kinds[2] > 0);
  CHECK(kinds[3] > 0);
}

TEST_CASE("random bytes transfers: host twin == naive reference") {
  std::mt19937_64 rng(7);
  for (int n = 0; n < 200; ++n) CheckCase(testing::RandomBytesCase(rng), rng);
}

TEST_CASE("serving layouts: the kernel's warp path writes what the reference writes") {
  std::mt19937_64 rng(11);
  const int before = g_piece_plans;
  const int cases = 120;
  for (int n = 0; n < cases; ++n) CheckCase(testing::RandomServingCase(rng), rng);
  // HND destinations with several heads, and 8-token blocks of one head, move 256-byte runs:
  // those take the slab path; most serving cases take the warp path.
  CHECK(g_piece_plans - before >= cases / 3);
}

TEST_CASE("TP1 prefill feeds TP4 decode ranks (head sub-ranges, NHD -> HND)") {
  // Source: 32 heads NHD, tpb 16; each rank: 8 heads HND, tpb 32.
  std::mt19937_64 rng(4);
  for (uint32_t rank = 0; rank < 4; ++rank) {
    testing::RandomCase c;
    c.src_layout.set_num_layers(3);
    c.src_layout.set_num_parts(2);
    c.src_layout.set_num_blocks(20);
    c.src_layout.set_tokens_per_block(16);
    c.src_layout.set_num_heads(32);
    c.src_layout.set_head_dim(64);
    c.src_layout.set_dtype(kvrail::v1::DTYPE_BF16);
    c.src_layout.set_order(kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
    c.dst_layout = c.src_layout;
    c.dst_layout.set_num_heads(8);
    c.dst_layout.set_tokens_per_block(32);
    c.dst_layout.set_order(kvrail::v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND);
    const uint64_t src_size = 3ull * 2 * 20 * 16 * 32 * 128;
    const uint64_t dst_size = 3ull * 2 * 20 * 32 * 8 * 128;
    c.src = RegionView{src_size, false, true, *ResolveLayout(c.src_layout, src_size, "")};
    c.dst = RegionView{dst_size, true, true, *ResolveLayout(c.dst_layout, dst_size, "")};
    for (uint32_t b : {3u, 17u, 4u, 9u, 0u}) c.spec.mutable_src()->add_block_ids(b);
    for (uint32_t b : {11u, 2u, 5u}) c.spec.mutable_dst()->add_block_ids(b);
    c.spec.mutable_src()->set_head_begin(8 * rank);
    c.spec.set_num_heads(8);
    c.options.tile_bytes = 8192;
    CheckCase(c, rng);
  }
}

TEST_CASE("deferred id checks: same bytes, and no tile passes that reads a bad id") {
  std::mt19937_64 rng(29);
  int defects_found_before_end = 0;
  for (int n = 0; n < 300; ++n) {
    testing::RandomCase c = testing::RandomPagedCase(rng);
    c.options.defer_checks_from = 1;
    if (n % 3 == 0) {
      // Valid ids: the host twin still writes what the reference writes (CheckCase runs every
      // tile; checks pass).
      absl::StatusOr<Plan> plan = MakePlan(c.spec, c.src, c.dst, c.options);
      REQUIRE(plan.ok());
      REQUIRE(plan->checks_deferred());
      REQUIRE(plan->CheckTiles(0, plan->num_tiles()).ok());
      CheckCase(c, rng);
      continue;
    }
    // One defect: an out-of-range id on either side, or a repeated destination id.
    const bool on_dst = rng() % 2 == 1;
    kvrail::v1::TransferEndpoint* side = on_dst ? c.spec.mutable_dst() : c.spec.mutable_src();
    const bool repeat = on_dst && side->block_ids_size() > 1 && rng() % 2 == 0;
    const int j = static_cast<int>(rng() % side->block_ids_size());
    if (repeat) {
      if (j == 0) continue;
      side->set_block_ids(j, side->block_ids(static_cast<int>(rng() % j)));
    } else {
      side->set_block_ids(j, UINT32_MAX - static_cast<uint32_t>(rng() % 16));
    }
    INFO(c.ToString());
    PlanOptions checked_options = c.options;
    checked_options.defer_checks_from = 0;
    const absl::Status full = MakePlan(c.spec, c.src, c.dst, checked_options).status();
    REQUIRE(full.code() == absl::StatusCode::kInvalidArgument);
    absl::StatusOr<Plan> plan = MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    // Tiles in order: passes until the first that reads (or, last, follows) the defect, then that
    // error for every tile after. Every tile that passes reads only bytes inside both regions.
    bool failed = false;
    for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
      const absl::Status st = plan->CheckTiles(t, t + 1);
      if (!st.ok()) {
        CHECK(st == full);
        if (!failed && t + 1 < plan->num_tiles()) ++defects_found_before_end;
        failed = true;
        continue;
      }
      REQUIRE_FALSE(failed);
      ForEachTileRun(*plan, t, [&](const CopyRun& run) {
        REQUIRE(run.src + run.bytes <= c.src.size_bytes);
        REQUIRE(run.dst + run.bytes <= c.dst.size_bytes);
      });
    }
    CHECK(failed);
  }
  // The checks are incremental, not all at the last tile.
  CHECK(defects_found_before_end > 20);
}

}  // namespace kvrail::planner
