// Unit tests of the planner: layout resolution and validation, request validation (code and the
// field named), coalescing, tiling and plan size.
#include "daemon/planner/planner.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "daemon/planner/testing/plan_fixtures.h"
#include "kernels/plan_math.h"

namespace kvrail::planner {
namespace {

using kvrail::v1::PagedKvLayout;
using kvrail::v1::TransferSpec;

using testing::Bytes;
using testing::ExpectError;
using testing::kBig;
using testing::kHnd;
using testing::kNhd;
using testing::LargeSpec;
using testing::Paged;
using testing::Proto;
using testing::Spec;
using testing::StartsWith;

}  // namespace

TEST_CASE("derived strides for every layout order") {
  // L=3, P=2, N=5 blocks, T=4 tokens, H=6 heads, D=8 bf16 -> vector 16 bytes.
  struct Case {
    kvrail::v1::LayoutOrder order;
    uint64_t ls, ps, bs, ts, hs;
  };
  const uint64_t v = 16, blk = 4 * 6 * v;  // one (l, p, block)
  const Case cases[] = {
      {kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD, 2 * 5 * blk, 5 * blk, blk, 6 * v, v},
      {kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND, 2 * 5 * blk, 5 * blk, blk, v, 4 * v},
      {kvrail::v1::LAYOUT_ORDER_BLOCK_LAYER_PART_NHD, 2 * blk, blk, 3 * 2 * blk, 6 * v, v},
      {kvrail::v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND, 2 * blk, blk, 3 * 2 * blk, v, 4 * v},
      {kvrail::v1::LAYOUT_ORDER_LAYER_BLOCK_PART_NHD, 5 * 2 * blk, blk, 2 * blk, 6 * v, v},
  };
  for (const Case& c : cases) {
    INFO("order " << c.order);
    absl::StatusOr<KvLayout> l =
        ResolveLayout(Proto(3, 2, 5, 4, 6, 8, c.order), 3 * 2 * 5 * blk, "x.");
    REQUIRE(l.ok());
    CHECK(l->layer_stride == c.ls);
    CHECK(l->part_stride == c.ps);
    CHECK(l->block_stride == c.bs);
    CHECK(l->token_stride == c.ts);
    CHECK(l->head_stride == c.hs);
    CHECK(l->dtype_bytes == 2);
    // Dense: exactly the region size fits, one byte less does not.
    CHECK(ResolveLayout(Proto(3, 2, 5, 4, 6, 8, c.order), 3 * 2 * 5 * blk - 1, "x.")
              .status()
              .code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("layout validation names the field") {
  const std::string p = "spec.paged_kv.";
  auto check = [&](PagedKvLayout l, const std::string& field, uint64_t size = kBig) {
    ExpectError(ResolveLayout(l, size, p).status(), absl::StatusCode::kInvalidArgument,
                p + field + ":");
  };
  PagedKvLayout good = Proto(2, 2, 8, 16, 4, 64, kNhd);
  REQUIRE(ResolveLayout(good, kBig, p).ok());
  auto with = [&](auto f) {
    PagedKvLayout l = good;
    f(l);
    return l;
  };
  check(with([](auto& l) { l.set_num_layers(0); }), "num_layers");
  check(with([](auto& l) { l.set_num_parts(0); }), "num_parts");
  check(with([](auto& l) { l.set_num_parts(3); }), "num_parts");
  check(with([](auto& l) { l.set_num_blocks(0); }), "num_blocks");
  check(with([](auto& l) { l.set_tokens_per_block(0); }), "tokens_per_block");
  check(with([](auto& l) { l.set_num_heads(0); }), "num_heads");
  check(with([](auto& l) { l.set_head_dim(0); }), "head_dim");
  check(with([](auto& l) { l.set_dtype(kvrail::v1::DTYPE_UNSPECIFIED); }), "dtype");
  check(with([](auto& l) { l.set_order(kvrail::v1::LAYOUT_ORDER_UNSPECIFIED); }), "order");
  check(good, "offset_bytes", 1000);
  check(with([](auto& l) { l.set_offset_bytes(kBig); }), "offset_bytes");

  // Explicit strides: NHD dense with one overlapping / misaligned stride at a time.
  const uint64_t v = 128, ts = 4 * v, bs = 16 * ts, ps = 8 * bs, ls = 2 * ps;
  auto explicit_layout = [&](uint64_t l_s, uint64_t p_s, uint64_t b_s, uint64_t t_s, uint64_t h_s) {
    PagedKvLayout l = good;
    l.set_layer_stride(l_s);
    l.set_part_stride(p_s);
    l.set_block_stride(b_s);
    l.set_token_stride(t_s);
    l.set_head_stride(h_s);
    return l;
  };
  REQUIRE(ResolveLayout(explicit_layout(ls, ps, bs, ts, v), kBig, p).ok());
  check(explicit_layout(ls, ps, bs, ts, v + 1), "head_stride");   // not a multiple of 2
  check(explicit_layout(ls, ps, bs + 3, ts, v), "block_stride");  // not a multiple of 2
  check(explicit_layout(ls, ps, bs, ts, v - 2), "head_stride");   // head vectors overlap
  check(explicit_layout(ls, ps, bs, ts - 2, v), "token_stride");  // tokens overlap heads
  check(explicit_layout(ls, ps, bs - 2, ts, v), "block_stride");
  check(explicit_layout(ls, ps, ts, ts, v), "block_stride");  // two dims share one stride
  check(explicit_layout(ls, 0, bs, ts, v), "part_stride");    // a zero stride on a real dim
  // Padding is fine; a dimension of extent 1 may have any stride.
  CHECK(ResolveLayout(explicit_layout(ls * 4, ps * 2, bs * 2, ts * 2, v * 2), kBig, p).ok());
  CHECK(ResolveLayout(explicit_layout(ls + 512, ps + 256, bs + 16, ts, v), kBig, p).ok());
  PagedKvLayout one_layer = explicit_layout(0, ps, bs, ts, v);
  one_layer.set_num_layers(1);
  CHECK(ResolveLayout(one_layer, kBig, p).ok());
}

TEST_CASE("fast division is exact") {
  std::vector<uint32_t> divisors = {
      1, 2, 3, 5, 7, 16, 17, 100, 4095, 4096, 65537, 1u << 30, (1u << 30) + 1};
  uint64_t x = 12345;
  for (int k = 0; k < 200; ++k) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    divisors.push_back(static_cast<uint32_t>(x >> 33) % 1000000 + 1);
  }
  for (uint32_t d : divisors) {
    const kernels::FastDivU32 f = kernels::MakeFastDiv(d);
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 2 * d - 1, kernels::kFastDivMaxDividend,
                       kernels::kFastDivMaxDividend - 1}) {
      if (n > kernels::kFastDivMaxDividend) continue;
      REQUIRE(kernels::FastDiv(f, n) == n / d);
    }
    for (int k = 0; k < 2000; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const uint32_t n = static_cast<uint32_t>(x >> 33);  // < 2^31
      REQUIRE(kernels::FastDiv(f, n) == n / d);
    }
  }
}

TEST_CASE("a transfer of too many tiles is refused before anything is built") {
  // 4 layers x 2 parts x 4096 blocks of 16 tokens x 8 heads x 64 dims: 64 MiB of 16 KiB blocks.
  const RegionView src = Paged(Proto(4, 2, 4096, 16, 8, 64, kNhd));
  const RegionView dst = Paged(Proto(4, 2, 4096, 16, 8, 64, kNhd));
  std::vector<uint32_t> ids(4096);
  std::iota(ids.begin(), ids.end(), 0);
  const TransferSpec spec = Spec(ids, ids);
  PlanOptions tiny;
  tiny.tile_bytes = 16;  // a peer asking for 16-byte tiles: 4M tiles
  ExpectError(MakePlan(spec, src, dst, tiny).status(), absl::StatusCode::kResourceExhausted,
              "spec.num_tokens: the transfer would be ");
  CHECK(std::string(MakePlan(spec, src, dst, tiny).status().message())
            .find("tiles (at most 1048576 per transfer)") != std::string::npos);
  tiny.max_tiles = 0;  // no cap (the planner's own tests)
  CHECK(MakePlan(spec, src, dst, tiny).ok());
  PlanOptions bytes_options;
  bytes_options.tile_bytes = 1;
  TransferSpec bytes;
  bytes.set_num_bytes(uint64_t{1} << 26);
  ExpectError(MakePlan(bytes, Bytes(1 << 26), Bytes(1 << 26, true), bytes_options).status(),
              absl::StatusCode::kResourceExhausted, "spec.num_bytes: the transfer would be");
}

TEST_CASE("transfer validation names the field") {
  const RegionView src = Paged(Proto(4, 2, 4096, 16, 8, 64, kNhd));
  const RegionView dst = Paged(Proto(4, 2, 4096, 16, 8, 64, kNhd));
  const TransferSpec base = Spec({1, 2, 3}, {7, 8, 9});
  REQUIRE(MakePlan(base, src, dst, {}).ok());
  auto err = [&](const TransferSpec& s, const RegionView& a, const RegionView& b) {
    return MakePlan(s, a, b, {}).status();
  };
  const auto kInv = absl::StatusCode::kInvalidArgument;

  ExpectError(err(base, src, Paged(Proto(4, 2, 4096, 16, 8, 64, kNhd), /*writable=*/false)),
              absl::StatusCode::kFailedPrecondition, "spec.dst.region_id: region is not writable");
  ExpectError(err(base, src, Bytes(1 << 20)), kInv, "spec.dst.region_id:");
  ExpectError(err(base, Bytes(1 << 20), dst), kInv, "spec.dst.region_id:");

  TransferSpec s = Spec({1, 9000, 3}, {7, 8, 9});
  ExpectError(err(s, src, dst), kInv, "spec.src.block_ids[1]: block 9000 out of range [0, 4096)");
  s = Spec({1, 2, 3}, {7, 8, 9, 1, 2, 4096});
  ExpectError(err(s, src, dst), kInv, "spec.dst.block_ids[5]: block 4096 out of range [0, 4096)");
  s = Spec({1, 2, 3}, {7, 8, 7});
  ExpectError(err(s, src, dst), kInv,
              "spec.dst.block_ids[2]: block 7 repeats spec.dst.block_ids[0]");
  s = Spec({1, 1, 1}, {7, 8, 9});  // repeats are fine on the source
  CHECK(MakePlan(s, src, dst, {}).ok());
  ExpectError(err(Spec({}, {7}), src, dst), kInv, "spec.src.block_ids:");
  s = Spec({1, 2, 3}, {7, 8});
  ExpectError(err(s, src, dst), kInv, "spec.dst.block_ids:");
  s = base;
  s.set_num_tokens(49);
  ExpectError(err(s, src, dst), kInv, "spec.num_tokens:");
  s.set_num_tokens(33);  // three source blocks cover it; three destination blocks too
  CHECK(MakePlan(s, src, dst, {}).ok());
  s = Spec({1, 2, 3}, {7, 8});
  s.set_num_tokens(32);  // two destination blocks are enough for 32 tokens
  CHECK(MakePlan(s, src, dst, {}).ok());

  s = base;
  s.mutable_src()->set_layer_begin(4);
  ExpectError(err(s, src, dst), kInv, "spec.src.layer_begin:");
  s = base;
  s.mutable_src()->set_layer_begin(1);
  s.set_num_layers(4);
  ExpectError(err(s, src, dst), kInv, "spec.num_layers:");
  s = base;
  s.mutable_dst()->set_layer_begin(1);  // 4 layers (all of the source) do not fit from 1
  ExpectError(err(s, src, dst), kInv, "spec.dst.layer_begin:");
  s.set_num_layers(3);
  CHECK(MakePlan(s, src, dst, {}).ok());

  s = base;
  s.mutable_src()->set_head_begin(8);
  ExpectError(err(s, src, dst), kInv, "spec.src.head_begin:");
  s = base;
  s.mutable_src()->set_head_begin(4);
  s.set_num_heads(5);
  ExpectError(err(s, src, dst), kInv, "spec.num_heads:");
  s = base;
  s.mutable_dst()->set_head_begin(2);  // 8 heads from 2 do not fit 8
  ExpectError(err(s, src, dst), kInv, "spec.dst.head_begin:");

  // Head vector and part mismatches.
  ExpectError(err(base, src, Paged(Proto(4, 2, 4096, 16, 8, 128, kNhd))), kInv,
              "spec.dst.region_id:");
  ExpectError(err(base, src, Paged(Proto(4, 2, 4096, 16, 8, 64, kNhd, kvrail::v1::DTYPE_FP32))),
              kInv, "spec.dst.region_id:");
  ExpectError(err(base, src, Paged(Proto(4, 1, 4096, 16, 8, 64, kNhd))), kInv,
              "spec.dst.region_id:");
}

TEST_CASE("dtypes of one size are not mixed unless the spec asks to reinterpret") {
  // Bytes move unconverted: an fp16 pool into a bf16 pool would be silently wrong numbers.
  const RegionView bf16 = Paged(Proto(4, 2, 64, 16, 8, 64, kNhd, kvrail::v1::DTYPE_BF16));
  const RegionView fp16 = Paged(Proto(4, 2, 64, 16, 8, 64, kNhd, kvrail::v1::DTYPE_FP16));
  const RegionView fp8 = Paged(Proto(4, 2, 64, 16, 8, 64, kNhd, kvrail::v1::DTYPE_FP8_E4M3));
  const RegionView int8 = Paged(Proto(4, 2, 64, 16, 8, 64, kNhd, kvrail::v1::DTYPE_INT8));
  TransferSpec s = Spec({1, 2}, {3, 4});
  CHECK(MakePlan(s, bf16, bf16, {}).ok());
  ExpectError(MakePlan(s, fp16, bf16, {}).status(), absl::StatusCode::kInvalidArgument,
              "spec.reinterpret_dtype: the source's paged_kv.dtype is DTYPE_FP16, the "
              "destination's DTYPE_BF16");
  ExpectError(MakePlan(s, fp8, int8, {}).status(), absl::StatusCode::kInvalidArgument,
              "spec.reinterpret_dtype:");
  s.set_reinterpret_dtype(true);
  const absl::StatusOr<Plan> reinterpreted = MakePlan(s, fp16, bf16, {});
  REQUIRE(reinterpreted.ok());
  CHECK(reinterpreted->header().bytes_total ==
        MakePlan(Spec({1, 2}, {3, 4}), bf16, bf16, {})->header().bytes_total);
  CHECK(MakePlan(s, fp8, int8, {}).ok());
  // Different sizes stay refused: reinterpreting cannot make 4-byte elements out of 2.
  const RegionView fp32 = Paged(Proto(4, 2, 64, 16, 8, 64, kNhd, kvrail::v1::DTYPE_FP32));
  ExpectError(MakePlan(s, fp32, bf16, {}).status(), absl::StatusCode::kInvalidArgument,
              "spec.dst.region_id:");
}

TEST_CASE("bytes transfers: bounds and tiles") {
  TransferSpec s;
  s.mutable_src()->set_byte_offset(100);
  s.mutable_dst()->set_byte_offset(0);
  s.set_num_bytes(900);
  CHECK(MakePlan(s, Bytes(1000), Bytes(900), {}).ok());
  ExpectError(MakePlan(s, Bytes(999), Bytes(900), {}).status(), absl::StatusCode::kInvalidArgument,
              "spec.src.byte_offset:");
  ExpectError(MakePlan(s, Bytes(1000), Bytes(899), {}).status(), absl::StatusCode::kInvalidArgument,
              "spec.dst.byte_offset:");
  ExpectError(MakePlan(s, Bytes(1000), Bytes(900, false), {}).status(),
              absl::StatusCode::kFailedPrecondition, "spec.dst.region_id: region is not writable");
  s.set_num_bytes(0);
  ExpectError(MakePlan(s, Bytes(1000), Bytes(900), {}).status(), absl::StatusCode::kInvalidArgument,
              "spec.num_bytes:");
  s.mutable_src()->set_byte_offset(kBig);  // overflow-safe bounds
  s.set_num_bytes(UINT64_MAX - 10);
  ExpectError(MakePlan(s, Bytes(1000), Bytes(900), {}).status(), absl::StatusCode::kInvalidArgument,
              "spec.src.byte_offset:");

  // 10000 bytes at offset 3 in tiles of 4096: 3 tiles, all layer 0, bytes add up, copy is exact.
  TransferSpec t;
  t.mutable_src()->set_byte_offset(3);
  t.mutable_dst()->set_byte_offset(5);
  t.set_num_bytes(10000);
  absl::StatusOr<Plan> plan = MakePlan(t, Bytes(20000), Bytes(20000), PlanOptions{4096});
  REQUIRE(plan.ok());
  CHECK(plan->num_tiles() == 3);
  CHECK(plan->header().access_bytes == 1);
  std::vector<uint8_t> a(20000), b(20000, 0xAB);
  std::iota(a.begin(), a.end(), 0);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < plan->num_tiles(); ++i) {
    CHECK(plan->tile(i).layer == 0);
    sum += plan->tile(i).bytes;
    ExecuteTileHost(*plan, i, a.data(), b.data());
  }
  CHECK(sum == 10000);
  CHECK(std::memcmp(b.data() + 5, a.data() + 3, 10000) == 0);
  CHECK(b[4] == 0xAB);
  CHECK(b[10005] == 0xAB);
}

TEST_CASE("coalescing: same-layout NHD full heads moves whole blocks, consecutive blocks merge") {
  const uint32_t tpb = 16, heads = 8, hd = 128;
  const RegionView r = Paged(Proto(2, 2, 1024, tpb, heads, hd, kNhd));
  TransferSpec s = Spec({10, 11, 12, 13, 40, 41}, {100, 101, 102, 500, 501, 502});
  absl::StatusOr<Plan> plan = MakePlan(s, r, r, {});
  REQUIRE(plan.ok());
  INFO(plan->Describe());
  CHECK(plan->chunk_kind() == kernels::ChunkKind::kBlockTokens);
  CHECK(plan->chunk_bytes() == uint64_t{tpb} * heads * hd * 2);
  CHECK(plan->header().access_bytes == 16);
  CHECK(plan->num_chunks() == 6 * 2 * 2);
  // Runs per (layer, part): [10-12 -> 100-102], [13 -> 500], [40,41 -> 501,502]: 3.
  CHECK(plan->num_runs() == 3 * 2 * 2);
  CHECK(plan->Describe().find("chunk 32768 B") != std::string::npos);

  // A head sub-range (TP split) on a full-head side: heads still merge per token, blocks do not.
  const RegionView half = Paged(Proto(2, 2, 1024, tpb, heads / 2, hd, kNhd));
  s.set_num_heads(4);
  s.mutable_src()->set_head_begin(4);
  plan = MakePlan(s, r, half, {});
  REQUIRE(plan.ok());
  CHECK(plan->chunk_kind() == kernels::ChunkKind::kTokenHeads);
  CHECK(plan->chunk_bytes() == 4 * hd * 2);

  // NHD -> HND: only head vectors are contiguous on both sides.
  plan = MakePlan(Spec({1, 2}, {3, 4}), r, Paged(Proto(2, 2, 1024, tpb, heads, hd, kHnd)), {});
  REQUIRE(plan.ok());
  CHECK(plan->chunk_kind() == kernels::ChunkKind::kHeadVector);
  CHECK(plan->chunk_bytes() == hd * 2);

  // Different tokens per block: tokens (all heads) are the unit.
  plan = MakePlan(Spec({1, 2}, {3, 4, 5, 6}), r, Paged(Proto(2, 2, 1024, 8, heads, hd, kNhd)), {});
  REQUIRE(plan.ok());
  CHECK(plan->chunk_kind() == kernels::ChunkKind::kTokenHeads);
}

TEST_CASE("tiles never span layers and are layer-ordered") {
  const RegionView r = Paged(Proto(6, 2, 512, 16, 8, 128, kNhd));
  TransferSpec s = Spec({}, {});
  for (uint32_t b = 0; b < 100; ++b) {
    s.mutable_src()->add_block_ids(b);
    s.mutable_dst()->add_block_ids(511 - b);
  }
  s.mutable_src()->set_layer_begin(1);
  s.set_num_layers(4);
  s.mutable_dst()->set_layer_begin(2);
  absl::StatusOr<Plan> plan = MakePlan(s, r, r, PlanOptions{100000});
  REQUIRE(plan.ok());
  INFO(plan->Describe());
  const uint64_t per_layer = 100ull * 16 * 8 * 128 * 2 * 2;
  CHECK(plan->bytes_total() == 4 * per_layer);
  CHECK(plan->num_layers() == 4);
  std::vector<uint64_t> layer_bytes(4, 0);
  uint32_t last = 0;
  for (uint32_t i = 0; i < plan->num_tiles(); ++i) {
    const TileInfo t = plan->tile(i);
    REQUIRE(t.layer < 4);
    CHECK(t.layer >= last);
    CHECK(t.bytes <= 100000);
    CHECK(t.bytes > 0);
    last = t.layer;
    layer_bytes[t.layer] += t.bytes;
  }
  for (uint64_t b : layer_bytes) CHECK(b == per_layer);
  CHECK(plan->num_tiles() == 4 * plan->tiles_per_layer());
}

TEST_CASE("plans are O(blocks) integers, never per-block descriptors") {
  const uint32_t n = 100000;
  const RegionView r = Paged(Proto(32, 2, 2 * n, 16, 8, 128, kNhd));
  absl::StatusOr<Plan> plan = MakePlan(LargeSpec(n), r, r, {});
  REQUIRE(plan.ok());
  INFO(plan->Describe());
  CHECK(plan->src_blocks().size() == n);
  CHECK(plan->dst_blocks().size() == n);
  // The header is fixed-size; the plan object is the header plus the two tables.
  static_assert(sizeof(kernels::PlanHeader) < 512, "header has no per-block storage");
  CHECK(sizeof(Plan) < 512 + 2 * sizeof(BlockTable) + 64);
  CHECK(plan->bytes_total() == uint64_t{n} * 16 * 8 * 128 * 2 * 2 * 32);
  CHECK(plan->num_tiles() == plan->bytes_total() / (1 << 20));
}

namespace {

std::string Le32(const std::vector<uint32_t>& ids) {
  std::string bytes(4 * ids.size(), '\0');
  std::memcpy(bytes.data(), ids.data(), bytes.size());
  return bytes;
}

TEST_CASE("block_ids_le32 is the same block table in fixed-width form") {
  const auto layout = Paged(Proto(2, 2, 64, 16, 4, 64, kNhd));
  const std::vector<uint32_t> src = {5, 9, 1, 40}, dst = {3, 2, 63, 0};
  auto varint = MakePlan(Spec(src, dst), layout, layout, {});
  REQUIRE(varint.ok());
  TransferSpec compact;
  compact.mutable_src()->set_block_ids_le32(Le32(src));
  compact.mutable_dst()->set_block_ids_le32(Le32(dst));
  auto fixed = MakePlan(compact, layout, layout, {});
  REQUIRE(fixed.ok());
  CHECK(fixed->src_blocks() == varint->src_blocks());
  CHECK(fixed->dst_blocks() == varint->dst_blocks());
  CHECK(fixed->bytes_total() == varint->bytes_total());

  SECTION("errors name the encoding used") {
    auto s = compact;
    s.mutable_dst()->set_block_ids_le32(Le32({3, 2, 64, 0}));
    ExpectError(MakePlan(s, layout, layout, {}).status(), absl::StatusCode::kInvalidArgument,
                "spec.dst.block_ids_le32[2]:");
    s = compact;
    s.mutable_dst()->set_block_ids_le32(Le32({3, 2, 3, 0}));
    ExpectError(MakePlan(s, layout, layout, {}).status(), absl::StatusCode::kInvalidArgument,
                "spec.dst.block_ids_le32[2]:");
    s = compact;
    s.mutable_src()->mutable_block_ids_le32()->push_back('\0');
    ExpectError(MakePlan(s, layout, layout, {}).status(), absl::StatusCode::kInvalidArgument,
                "spec.src.block_ids_le32:");
    s = compact;
    s.mutable_src()->add_block_ids(1);
    ExpectError(MakePlan(s, layout, layout, {}).status(), absl::StatusCode::kInvalidArgument,
                "spec.src.block_ids_le32:");
  }
}

TEST_CASE("block tables read in place: same plan, errors name the table field") {
  const RegionView src = Paged(Proto(2, 2, 4096, 16, 8, 64, kNhd));
  const RegionView dst = Paged(Proto(2, 2, 4096, 16, 8, 64, kHnd));
  std::vector<uint32_t> src_ids = {5, 1, 4000, 7}, dst_ids = {9, 3, 2, 11};
  absl::StatusOr<Plan> in_message = MakePlan(Spec(src_ids, dst_ids), src, dst, {});
  REQUIRE(in_message.ok());
  TableRefs refs;
  refs.src = TableRef{src_ids.data(), src_ids.size(), "src.block_table"};
  refs.dst = TableRef{dst_ids.data(), dst_ids.size(), "dst.block_table"};
  absl::StatusOr<Plan> in_place = MakePlan(TransferSpec(), src, dst, {}, refs);
  REQUIRE(in_place.ok());
  CHECK(in_place->src_blocks() == in_message->src_blocks());
  CHECK(in_place->dst_blocks() == in_message->dst_blocks());
  CHECK(std::memcmp(&in_place->header(), &in_message->header(), sizeof(kernels::PlanHeader)) == 0);
  // The plan holds a copy: the caller's memory may change afterwards.
  src_ids[0] = 6;
  CHECK(in_place->src_blocks()[0] == 5);

  const auto kInv = absl::StatusCode::kInvalidArgument;
  dst_ids[2] = 9;
  ExpectError(MakePlan(TransferSpec(), src, dst, {}, refs).status(), kInv,
              "spec.dst.block_table[2]: block 9 repeats spec.dst.block_table[0]");
  dst_ids[2] = 2;
  src_ids[3] = 4096;
  ExpectError(MakePlan(TransferSpec(), src, dst, {}, refs).status(), kInv,
              "spec.src.block_table[3]: block 4096 out of range [0, 4096)");
  src_ids[3] = 7;
  TransferSpec both;
  both.mutable_src()->add_block_ids(1);
  ExpectError(MakePlan(both, src, dst, {}, refs).status(), kInv,
              "spec.src.block_table: set one of");
}

TEST_CASE("deferred id checks: accepted at once, each tile's ids checked before it may run") {
  const uint32_t n = 40000;
  const RegionView r = Paged(Proto(1, 1, 2 * n, 16, 1, 64, kNhd));  // 2 KiB blocks
  PlanOptions options;
  options.tile_bytes = 64 << 10;  // 32 blocks per tile, 1250 tiles
  options.defer_checks_from = 1000;
  const TransferSpec s = LargeSpec(n);
  PlanOptions plain;  // everything checked in MakePlan
  plain.tile_bytes = options.tile_bytes;

  // Valid ids: the same plan as a checked one, and every tile passes.
  absl::StatusOr<Plan> checked = MakePlan(s, r, r, plain);
  absl::StatusOr<Plan> deferred = MakePlan(s, r, r, options);
  REQUIRE(checked.ok());
  REQUIRE(deferred.ok());
  CHECK_FALSE(checked->checks_deferred());
  CHECK(deferred->checks_deferred());
  CHECK(deferred->num_tiles() == 1250);
  CHECK(deferred->src_blocks() == checked->src_blocks());
  CHECK(deferred->dst_blocks() == checked->dst_blocks());
  CHECK(deferred->CheckTiles(0, deferred->num_tiles()).ok());
  CHECK(deferred->Describe().find("ids checked as tiles start") != std::string::npos);
  // The runs are estimated from the first 8192 entries (scattered ids: almost every chunk).
  CHECK(deferred->runs_estimated());
  CHECK_FALSE(checked->runs_estimated());
  CHECK(deferred->num_runs() > checked->num_runs() * 95 / 100);
  CHECK(deferred->num_runs() < checked->num_runs() * 105 / 100 + 1);
  {
    // Consecutive ids on both sides stay one run.
    TransferSpec seq;
    for (uint32_t b = 0; b < n; ++b) {
      seq.mutable_src()->add_block_ids(b);
      seq.mutable_dst()->add_block_ids(n + b);
    }
    absl::StatusOr<Plan> one = MakePlan(seq, r, r, options);
    REQUIRE(one.ok());
    CHECK(one->num_runs() == 1);
  }

  // Below the threshold nothing is deferred.
  options.defer_checks_from = 2 * n + 1;
  absl::StatusOr<Plan> small = MakePlan(s, r, r, options);
  REQUIRE(small.ok());
  CHECK_FALSE(small->checks_deferred());
  options.defer_checks_from = 1000;

  // A repeated destination id at 39999 (tile 1249): every earlier tile passes, the tile that
  // reads it fails with the message a full check gives, and so does every call after.
  TransferSpec dup = s;
  dup.mutable_dst()->set_block_ids(39999, dup.dst().block_ids(7));
  absl::StatusOr<Plan> late = MakePlan(dup, r, r, options);
  REQUIRE(late.ok());
  CHECK(late->CheckTiles(0, 100).ok());
  CHECK(late->CheckTiles(100, 1249).ok());
  ExpectError(late->CheckTiles(1249, 1250), absl::StatusCode::kInvalidArgument,
              "spec.dst.block_ids[39999]: block 79992 repeats spec.dst.block_ids[7]");
  ExpectError(late->CheckTiles(0, 1), absl::StatusCode::kInvalidArgument,
              "spec.dst.block_ids[39999]");
  // Copies of the plan share the verdict.
  const Plan copy = *late;
  ExpectError(copy.CheckTiles(5, 6), absl::StatusCode::kInvalidArgument,
              "spec.dst.block_ids[39999]");

  // A bad source id at 30000 (tile 937) and the repeat above: the first in table order.
  TransferSpec both = dup;
  both.mutable_src()->set_block_ids(30000, 2 * n);
  absl::StatusOr<Plan> two = MakePlan(both, r, r, options);
  REQUIRE(two.ok());
  CHECK(two->CheckTiles(0, 937).ok());
  ExpectError(two->CheckTiles(0, 938), absl::StatusCode::kInvalidArgument,
              "spec.src.block_ids[30000]: block 80000 out of range [0, 80000)");

  // A destination error before a source error is found first (the tiles reach it first).
  TransferSpec early = s;
  early.mutable_dst()->set_block_ids(100, 2 * n + 5);
  early.mutable_src()->set_block_ids(30000, 2 * n);
  absl::StatusOr<Plan> first = MakePlan(early, r, r, options);
  REQUIRE(first.ok());
  CHECK(first->CheckTiles(0, 3).ok());  // blocks 0..95
  ExpectError(first->CheckTiles(3, 4), absl::StatusCode::kInvalidArgument,
              "spec.dst.block_ids[100]: block 80005 out of range");

  // Ids past the tokens moved are never read, but still checked once the last tile is.
  TransferSpec tail = s;
  tail.set_num_tokens(16 * (n / 2));
  tail.mutable_src()->set_block_ids(n - 1, 2 * n + 1);
  absl::StatusOr<Plan> half = MakePlan(tail, r, r, options);
  REQUIRE(half.ok());
  CHECK(half->src_blocks().size() == n / 2);
  CHECK(half->CheckTiles(0, half->num_tiles() - 1).ok());
  ExpectError(half->CheckTiles(half->num_tiles() - 1, half->num_tiles()),
              absl::StatusCode::kInvalidArgument,
              "spec.src.block_ids[39999]: block 80001 out of range");
  ExpectError(MakePlan(tail, r, r, plain).status(), absl::StatusCode::kInvalidArgument,
              "spec.src.block_ids[39999]");

  // Sides with different tokens per block: each side's table is checked as far as its tokens go.
  const RegionView fine = Paged(Proto(1, 1, 4 * n, 8, 1, 64, kNhd));  // 8-token blocks
  TransferSpec mixed = Spec({}, {});
  for (uint32_t b = 0; b < n; ++b) mixed.mutable_src()->add_block_ids(b);
  for (uint32_t b = 0; b < 2 * n; ++b) mixed.mutable_dst()->add_block_ids(4 * n - 1 - b);
  mixed.mutable_dst()->set_block_ids(1030, 4 * n);  // tokens 8240..8247: tile 16 (8192..8703)
  absl::StatusOr<Plan> m = MakePlan(mixed, r, fine, options);
  REQUIRE(m.ok());
  CHECK(m->CheckTiles(0, 16).ok());
  ExpectError(m->CheckTiles(16, 17), absl::StatusCode::kInvalidArgument,
              "spec.dst.block_ids[1030]: block 160000 out of range");
}

TEST_CASE("deferred id checks: concurrent callers check each id once and agree") {
  const uint32_t n = 40000;
  const RegionView r = Paged(Proto(1, 1, 2 * n, 16, 1, 64, kNhd));
  TransferSpec dup = LargeSpec(n);
  dup.mutable_dst()->set_block_ids(20000, dup.dst().block_ids(19999));
  PlanOptions options;
  options.tile_bytes = 64 << 10;
  options.defer_checks_from = 1;
  absl::StatusOr<Plan> plan = MakePlan(dup, r, r, options);
  REQUIRE(plan.ok());
  // Four threads check tiles in interleaved order, as host engine workers do.
  std::vector<std::vector<absl::Status>> got(4, std::vector<absl::Status>(plan->num_tiles()));
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (uint32_t t = w; t < plan->num_tiles(); t += 4) got[w][t] = plan->CheckTiles(t, t + 1);
    });
  }
  for (auto& t : threads) t.join();
  const uint32_t bad_tile = 20000 / 32;  // 625
  for (int w = 0; w < 4; ++w) {
    for (uint32_t t = w; t < plan->num_tiles(); t += 4) {
      INFO("tile " << t);
      if (t < bad_tile) {
        // May pass or fail: a thread that reached a later tile first found the repeat.
        if (!got[w][t].ok()) {
          ExpectError(got[w][t], absl::StatusCode::kInvalidArgument, "spec.dst.block_ids[20000]");
        }
      } else {
        ExpectError(got[w][t], absl::StatusCode::kInvalidArgument,
                    "spec.dst.block_ids[20000]: block 60000 repeats spec.dst.block_ids[19999]");
      }
    }
  }
}

}  // namespace
TEST_CASE(
    "ResolveLayout per-layer: layer_stride must be 0, layers not checked against each other") {
  const auto kInv = absl::StatusCode::kInvalidArgument;
  PagedKvLayout p = Proto(32, 2, 64, 16, 8, 128, kNhd);
  // Derived strides: those of one layer, layer_stride 0, and one layer's span must fit.
  const uint64_t one_layer = 2ull * 64 * 16 * 8 * 256;
  absl::StatusOr<KvLayout> l = ResolveLayout(p, one_layer, "spec.paged_kv.", /*per_layer=*/true);
  REQUIRE(l.ok());
  CHECK(l->layer_stride == 0);
  CHECK(l->part_stride == 64ull * 16 * 8 * 256);
  ExpectError(ResolveLayout(p, one_layer - 1, "spec.paged_kv.", true).status(), kInv,
              "spec.paged_kv.offset_bytes:");
  p.set_layer_stride(one_layer);
  p.set_part_stride(64ull * 16 * 8 * 256);
  p.set_block_stride(16 * 8 * 256);
  p.set_token_stride(8 * 256);
  p.set_head_stride(256);
  ExpectError(ResolveLayout(p, one_layer, "spec.paged_kv.", true).status(), kInv,
              "spec.paged_kv.layer_stride: must be 0");
  // Single-base: a zero layer stride with 32 layers makes layers overlap.
  p.set_layer_stride(0);
  CHECK(ResolveLayout(p, one_layer, "spec.paged_kv.", true).ok());
  ExpectError(ResolveLayout(p, one_layer, "spec.paged_kv.").status(), kInv,
              "spec.paged_kv.layer_stride:");
}

}  // namespace kvrail::planner
