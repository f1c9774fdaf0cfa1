// The integrity digest on the host (kernels/digest.h via host_twin.cc) against a reference
// written independently of the planner: every element byte enumerated straight from the spec and
// the layouts (as testing::ReferenceCopy does), placed at its logical position (stream, offset),
// grouped into words per tile from the definition, summed with digest::Mix. Random layouts on
// both sides (NHD <-> HND, block sizes, head and layer ranges, padded strides, per-layer regions,
// odd head-vector sizes at odd offsets, odd tile sizes).
#include <catch2/catch.hpp>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/digest.h"

namespace kvrail::planner {
namespace {

namespace dg = ::kvrail::kernels::digest;

// Per tile: word key -> value, built byte by byte from the definition.
using TileWords = std::map<uint32_t, std::map<uint64_t, uint64_t>>;

// Calls fn(stream, q, src_byte_pointer, dst_byte_pointer) for every byte the transfer moves,
// addresses from the layouts and the spec only (no plan_math).
template <typename Fn>
void ForEachLogicalByte(const testing::RandomCase& c, const uint8_t* src, uint8_t* dst, Fn fn) {
  const auto& spec = c.spec;
  if (!c.src.paged) {
    for (uint64_t b = 0; b < spec.num_bytes(); ++b) {
      fn(0, b, src + spec.src().byte_offset() + b, dst + spec.dst().byte_offset() + b);
    }
    return;
  }
  const KvLayout& s = c.src.layout;
  const KvLayout& d = c.dst.layout;
  const uint64_t layers =
      spec.num_layers() ? spec.num_layers() : s.num_layers - spec.src().layer_begin();
  const uint64_t heads =
      spec.num_heads() ? spec.num_heads() : s.num_heads - spec.src().head_begin();
  const uint64_t tokens = spec.num_tokens()
                              ? spec.num_tokens()
                              : uint64_t(spec.src().block_ids_size()) * s.tokens_per_block;
  const uint64_t vec = uint64_t{s.head_dim} * s.dtype_bytes;
  for (uint64_t l = 0; l < layers; ++l) {
    const uint32_t sl = static_cast<uint32_t>(spec.src().layer_begin() + l);
    const uint32_t dl = static_cast<uint32_t>(spec.dst().layer_begin() + l);
    const uint8_t* s_layer = c.src.layer_bases != nullptr
                                 ? reinterpret_cast<const uint8_t*>((*c.src.layer_bases)[sl])
                                 : src + sl * s.layer_stride;
    uint8_t* d_layer = c.dst.layer_bases != nullptr
                           ? reinterpret_cast<uint8_t*>((*c.dst.layer_bases)[dl])
                           : dst + dl * d.layer_stride;
    for (uint64_t p = 0; p < s.num_parts; ++p) {
      for (uint64_t i = 0; i < tokens; ++i) {
        for (uint64_t h = 0; h < heads; ++h) {
          const uint64_t so = s.offset + p * s.part_stride +
                              spec.src().block_ids(i / s.tokens_per_block) * s.block_stride +
                              (i % s.tokens_per_block) * s.token_stride +
                              (spec.src().head_begin() + h) * s.head_stride;
          const uint64_t dof = d.offset + p * d.part_stride +
                               spec.dst().block_ids(i / d.tokens_per_block) * d.block_stride +
                               (i % d.tokens_per_block) * d.token_stride +
                               (spec.dst().head_begin() + h) * d.head_stride;
          for (uint64_t b = 0; b < vec; ++b) {
            fn(l * s.num_parts + p, (i * heads + h) * vec + b, s_layer + so + b, d_layer + dof + b);
          }
        }
      }
    }
  }
}

// The reference digests of every tile on each side.
struct RefDigests {
  std::vector<uint64_t> src, dst;
};
RefDigests Reference(const testing::RandomCase& c, const kernels::PlanHeader& h, const uint8_t* src,
                     uint8_t* dst) {
  TileWords s_words, d_words;
  const uint64_t wps = (h.part_bytes + 7) / 8;
  ForEachLogicalByte(c, src, dst, [&](uint64_t stream, uint64_t q, const uint8_t* s, uint8_t* d) {
    const uint32_t tile = static_cast<uint32_t>(stream * h.tiles_per_part + q / h.tile_bytes);
    const uint64_t key = stream * wps + q / 8;
    s_words[tile][key] |= uint64_t{*s} << (8 * (q % 8));
    d_words[tile][key] |= uint64_t{*d} << (8 * (q % 8));
  });
  RefDigests out{std::vector<uint64_t>(h.num_tiles, 0), std::vector<uint64_t>(h.num_tiles, 0)};
  for (const auto& [tile, words] : s_words) {
    for (const auto& [key, value] : words) out.src[tile] += dg::Mix(value, key);
  }
  for (const auto& [tile, words] : d_words) {
    for (const auto& [key, value] : words) out.dst[tile] += dg::Mix(value, key);
  }
  return out;
}

// Memory of one side: the case's arena for a per-layer side, else a fresh buffer.
std::vector<uint8_t>& Side(std::shared_ptr<std::vector<uint8_t>> arena, std::vector<uint8_t>& own,
                           uint64_t size) {
  if (arena) return *arena;
  own.assign(size, 0);
  return own;
}

void CheckDigests(const testing::RandomCase& c, std::mt19937_64& rng) {
  INFO(c.ToString());
  absl::StatusOr<Plan> plan = MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  INFO(plan->Describe());
  std::vector<uint8_t> src_own, dst_own;
  std::vector<uint8_t>& src = Side(c.src_arena, src_own, c.src.size_bytes);
  std::vector<uint8_t>& dst = Side(c.dst_arena, dst_own, c.dst.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::fill(dst.begin(), dst.end(), 0xAB);

  std::vector<uint64_t> copied(plan->num_tiles());
  std::vector<uint32_t> order(plan->num_tiles());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (uint32_t t : order) copied[t] = ExecuteTileHostWithDigest(*plan, t, src.data(), dst.data());

  const RefDigests ref = Reference(c, plan->header(), src.data(), dst.data());
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    INFO("tile " << t);
    REQUIRE(copied[t] == ref.src[t]);
    REQUIRE(ref.dst[t] == ref.src[t]);
    REQUIRE(TileDigestHost(*plan, t, src.data(), DigestSide::kSource) == ref.src[t]);
    REQUIRE(TileDigestHost(*plan, t, dst.data(), DigestSide::kDestination) == ref.dst[t]);
    // Packed (the fabric's staging): the tile's runs back to back.
    std::vector<uint8_t> packed;
    ForEachTileRun(*plan, t, [&](const CopyRun& run) {
      const uint8_t* from = HostAddress(plan->header().src, src.data(), run.src);
      packed.insert(packed.end(), from, from + run.bytes);
    });
    REQUIRE(PackedTileDigest(*plan, t, packed.data()) == ref.src[t]);
  }
  // A changed destination byte changes exactly its tile's digest.
  if (plan->num_tiles() > 0) {
    const uint32_t t = static_cast<uint32_t>(rng() % plan->num_tiles());
    std::vector<CopyRun> runs;
    ForEachTileRun(*plan, t, [&](const CopyRun& run) { runs.push_back(run); });
    const CopyRun& run = runs[rng() % runs.size()];
    HostAddress(plan->header().dst, dst.data(), run.dst)[rng() % run.bytes] ^= 1;
    CHECK(TileDigestHost(*plan, t, dst.data(), DigestSide::kDestination) != ref.src[t]);
    if (plan->num_tiles() > 1) {
      const uint32_t other = (t + 1) % plan->num_tiles();
      CHECK(TileDigestHost(*plan, other, dst.data(), DigestSide::kDestination) == ref.src[other]);
    }
  }
}

}  // namespace

TEST_CASE("digest: random paged transfers == independent reference") {
  std::mt19937_64 rng(6017);
  for (int n = 0; n < 250; ++n) CheckDigests(testing::RandomPagedCase(rng), rng);
}

TEST_CASE("digest: per-layer sides == independent reference") {
  std::mt19937_64 rng(6018);
  for (int n = 0; n < 120; ++n) {
    testing::RandomCase c = testing::RandomPagedCase(rng);
    if (n % 3 != 1) testing::MakePerLayer(c, /*dst_side=*/false, rng);
    if (n % 3 != 0) testing::MakePerLayer(c, /*dst_side=*/true, rng);
    CheckDigests(c, rng);
  }
}

TEST_CASE("digest: serving layouts and bytes transfers == independent reference") {
  std::mt19937_64 rng(6019);
  for (int n = 0; n < 40; ++n) CheckDigests(testing::RandomServingCase(rng), rng);
  for (int n = 0; n < 100; ++n) CheckDigests(testing::RandomBytesCase(rng, 5000), rng);
}

TEST_CASE("digest: the same content in NHD and HND destinations, odd 657-byte vectors") {
  // 3 heads of 657 bytes (head_dim 657 of a 1-byte dtype), 5 tokens per block, a source offset
  // of 3 and an odd tile size: words straddle vectors, runs and tiles.
  std::mt19937_64 rng(657);
  testing::RandomCase base;
  base.src_layout.set_num_layers(2);
  base.src_layout.set_num_parts(2);
  base.src_layout.set_num_blocks(4);
  base.src_layout.set_tokens_per_block(5);
  base.src_layout.set_num_heads(3);
  base.src_layout.set_head_dim(657);
  base.src_layout.set_dtype(kvrail::v1::DTYPE_FP8_E4M3);
  base.src_layout.set_order(kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  base.src_layout.set_offset_bytes(3);
  const uint64_t size = 3 + 2ull * 2 * 4 * 5 * 3 * 657;
  base.src = RegionView{size, false, true, *ResolveLayout(base.src_layout, size, "")};
  for (uint32_t b : {2u, 0u, 3u}) base.spec.mutable_src()->add_block_ids(b);
  for (uint32_t b : {1u, 3u, 0u}) base.spec.mutable_dst()->add_block_ids(b);
  base.options.tile_bytes = 1001;
  std::vector<uint8_t> src(size);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<std::vector<uint64_t>> per_order;
  for (const auto order : {kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD,
                           kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND}) {
    testing::RandomCase c = base;
    c.dst_layout = c.src_layout;
    c.dst_layout.set_order(order);
    c.dst_layout.set_offset_bytes(0);
    c.dst = RegionView{size, true, true, *ResolveLayout(c.dst_layout, size, "")};
    absl::StatusOr<Plan> plan = MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    std::vector<uint8_t> dst(size, 0);
    std::vector<uint64_t> digests;
    for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
      const uint64_t s = ExecuteTileHostWithDigest(*plan, t, src.data(), dst.data());
      REQUIRE(TileDigestHost(*plan, t, dst.data(), DigestSide::kDestination) == s);
      digests.push_back(s);
    }
    const RefDigests ref = Reference(c, plan->header(), src.data(), dst.data());
    CHECK(digests == ref.src);
    per_order.push_back(digests);
  }
  // Layout-independent: the same bytes give the same digests in either destination layout.
  CHECK(per_order[0] == per_order[1]);
}

}  // namespace kvrail::planner
