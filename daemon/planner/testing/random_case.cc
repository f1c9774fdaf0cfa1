#include "daemon/planner/testing/random_case.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <sstream>
#include <vector>

namespace kvrail::planner::testing {
namespace {

uint32_t Uniform(std::mt19937_64& rng, uint32_t lo, uint32_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
}

bool Coin(std::mt19937_64& rng, double p = 0.5) { return std::bernoulli_distribution(p)(rng); }

kvrail::v1::DType RandomDType(std::mt19937_64& rng) {
  static const kvrail::v1::DType kTypes[] = {kvrail::v1::DTYPE_BF16, kvrail::v1::DTYPE_FP16,
                                             kvrail::v1::DTYPE_FP32, kvrail::v1::DTYPE_FP8_E4M3,
                                             kvrail::v1::DTYPE_UINT8};
  return kTypes[Uniform(rng, 0, 4)];
}

uint32_t DTypeSize(kvrail::v1::DType t) {
  switch (t) {
    case kvrail::v1::DTYPE_BF16:
    case kvrail::v1::DTYPE_FP16:
      return 2;
    case kvrail::v1::DTYPE_FP32:
      return 4;
    default:
      return 1;
  }
}

// Fills dims and strides of `p` (head_dim, dtype and parts already set). Returns the bytes the
// layout spans from its offset.
uint64_t RandomGeometry(std::mt19937_64& rng, const RandomLimits& lim, uint32_t layers,
                        uint32_t blocks, uint32_t tpb, uint32_t heads,
                        kvrail::v1::PagedKvLayout& p) {
  p.set_num_layers(layers);
  p.set_num_blocks(blocks);
  p.set_tokens_per_block(tpb);
  p.set_num_heads(heads);
  const uint32_t ds = DTypeSize(p.dtype());
  const uint64_t vec = uint64_t{p.head_dim()} * ds;
  // Offset: usually 16-byte aligned (fast path), sometimes only dtype aligned, rarely odd.
  const uint32_t r = Uniform(rng, 0, 9);
  p.set_offset_bytes(r < 6   ? 16 * Uniform(rng, 0, 8)
                     : r < 9 ? ds * Uniform(rng, 0, 40)
                             : Uniform(rng, 0, 99));
  if (Coin(rng, 0.4)) {
    p.set_order(static_cast<kvrail::v1::LayoutOrder>(Uniform(rng, 1, 5)));
    absl::StatusOr<KvLayout> k = ResolveLayout(p, UINT64_MAX, "");
    const uint64_t extent = k->layer_stride * (layers - 1) + k->part_stride * (p.num_parts() - 1) +
                            k->block_stride * (blocks - 1) + k->token_stride * (tpb - 1) +
                            k->head_stride * (heads - 1) + vec;
    return extent;
  }
  // Explicit strides: a random nesting order of the five dims, each stride the extent of the
  // dims inside it plus random padding (a multiple of the dtype size, often of 16 bytes).
  std::array<int, 5> order = {0, 1, 2, 3, 4};  // layer, part, block, token, head
  std::shuffle(order.begin(), order.end(), rng);
  const uint64_t extents[5] = {layers, p.num_parts(), blocks, tpb, heads};
  uint64_t strides[5] = {0, 0, 0, 0, 0};
  uint64_t extent = vec;
  const bool aligned = Coin(rng, 0.6);
  for (int d : order) {
    const uint64_t pad = aligned ? 16 * Uniform(rng, 0, 2) : ds * Uniform(rng, 0, 5);
    uint64_t stride = extent + pad;
    if (aligned) stride = (stride + 15) / 16 * 16;
    strides[d] = stride;
    extent += stride * (extents[d] - 1);
  }
  p.set_layer_stride(strides[0]);
  p.set_part_stride(strides[1]);
  p.set_block_stride(strides[2]);
  p.set_token_stride(strides[3]);
  p.set_head_stride(strides[4]);
  if (p.layer_stride() + p.part_stride() + p.block_stride() + p.token_stride() + p.head_stride() ==
      0) {
    p.set_head_stride(vec);  // never all zero: that would mean "derive"
  }
  (void)lim;
  return extent;
}

RegionView Resolve(const kvrail::v1::PagedKvLayout& p, uint64_t size, bool writable) {
  absl::StatusOr<KvLayout> k = ResolveLayout(p, size, "");
  if (!k.ok()) std::abort();  // the generator only builds valid layouts
  return RegionView{size, writable, true, *k};
}

}  // namespace

RandomCase RandomPagedCase(std::mt19937_64& rng, const RandomLimits& lim) {
  RandomCase c;
  const uint32_t parts = Coin(rng, 0.25) ? 1 : 2;
  const kvrail::v1::DType dtype = RandomDType(rng);
  uint32_t head_dim = Coin(rng, 0.5) ? (16 / DTypeSize(dtype)) * Uniform(rng, 1, 4)
                                     : Uniform(rng, 1, lim.max_head_dim);
  for (auto* p : {&c.src_layout, &c.dst_layout}) {
    p->set_num_parts(parts);
    p->set_dtype(dtype);
    p->set_head_dim(head_dim);
  }
  // Source dims.
  const uint32_t s_layers = Uniform(rng, 1, lim.max_layers);
  const uint32_t s_heads = Uniform(rng, 1, lim.max_heads);
  const uint32_t s_tpb = Uniform(rng, 1, lim.max_tpb);
  const uint32_t s_blocks = Uniform(rng, 1, lim.max_blocks);
  // Transfer ranges.
  auto& spec = c.spec;
  const uint32_t s_lb = Uniform(rng, 0, s_layers - 1);
  const uint32_t layers = Uniform(rng, 1, s_layers - s_lb);
  if (layers != s_layers - s_lb || Coin(rng)) spec.set_num_layers(layers);
  spec.mutable_src()->set_layer_begin(s_lb);
  const uint32_t s_hb = Uniform(rng, 0, s_heads - 1);
  const uint32_t heads = Uniform(rng, 1, s_heads - s_hb);
  if (heads != s_heads - s_hb || Coin(rng)) spec.set_num_heads(heads);
  spec.mutable_src()->set_head_begin(s_hb);
  // Destination dims: enough layers / heads for the ranges, its own tokens per block.
  const uint32_t d_lb = Uniform(rng, 0, 2);
  const uint32_t d_layers = d_lb + layers + Uniform(rng, 0, 1);
  const uint32_t d_hb = Coin(rng) ? 0 : Uniform(rng, 0, 3);
  const uint32_t d_heads = d_hb + heads + (Coin(rng) ? 0 : Uniform(rng, 0, 2));
  spec.mutable_dst()->set_layer_begin(d_lb);
  spec.mutable_dst()->set_head_begin(d_hb);
  const uint32_t d_tpb = Coin(rng, 0.5) ? s_tpb : Uniform(rng, 1, lim.max_tpb);
  // Tokens and block tables.
  const uint32_t src_table = Uniform(rng, 1, std::min<uint32_t>(lim.max_blocks, 3 * s_blocks));
  const uint64_t capacity = uint64_t{src_table} * s_tpb;
  uint64_t tokens = capacity;
  if (Coin(rng)) {
    tokens = Uniform(rng, 1, static_cast<uint32_t>(capacity));
    spec.set_num_tokens(tokens);
  }
  const bool scattered = Coin(rng, 0.7);
  for (uint32_t j = 0; j < src_table; ++j) {
    spec.mutable_src()->add_block_ids(scattered ? Uniform(rng, 0, s_blocks - 1) : j % s_blocks);
  }
  const uint32_t dst_need = static_cast<uint32_t>((tokens + d_tpb - 1) / d_tpb);
  const uint32_t d_blocks = dst_need + Uniform(rng, 0, 8);
  std::vector<uint32_t> ids(d_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  if (scattered) std::shuffle(ids.begin(), ids.end(), rng);
  const uint32_t dst_table = std::min<uint32_t>(d_blocks, dst_need + Uniform(rng, 0, 2));
  for (uint32_t j = 0; j < dst_table; ++j) spec.mutable_dst()->add_block_ids(ids[j]);

  const uint64_t s_span =
      RandomGeometry(rng, lim, s_layers, s_blocks, s_tpb, s_heads, c.src_layout);
  const uint64_t d_span =
      RandomGeometry(rng, lim, d_layers, d_blocks, d_tpb, d_heads, c.dst_layout);
  c.src = Resolve(c.src_layout, c.src_layout.offset_bytes() + s_span + Uniform(rng, 0, 64), false);
  c.dst = Resolve(c.dst_layout, c.dst_layout.offset_bytes() + d_span + Uniform(rng, 0, 64), true);
  static const uint64_t kTiles[] = {1, 16, 100, 256, 1000, 4096, 65536, 1 << 20};
  c.options.tile_bytes = kTiles[Uniform(rng, 0, 7)];
  return c;
}

RandomCase RandomServingCase(std::mt19937_64& rng) {
  static const uint32_t kHeads[] = {1, 2, 4, 8};
  const uint32_t heads = kHeads[Uniform(rng, 0, 3)];
  const uint32_t dst_tpb = Coin(rng) ? 16 : 8;
  const uint32_t layers = Uniform(rng, 1, 4), src_pool = 24, dst_pool = 48;
  RandomCase c;
  c.src_layout.set_num_layers(layers);
  c.src_layout.set_num_parts(2);
  c.src_layout.set_num_blocks(src_pool);
  c.src_layout.set_tokens_per_block(16);
  c.src_layout.set_num_heads(heads);
  c.src_layout.set_head_dim(128);
  c.src_layout.set_dtype(kvrail::v1::DTYPE_BF16);
  c.src_layout.set_order(kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  c.dst_layout = c.src_layout;
  c.dst_layout.set_tokens_per_block(dst_tpb);
  c.dst_layout.set_num_blocks(dst_pool);
  c.dst_layout.set_order(Coin(rng) ? kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD
                                   : kvrail::v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND);
  const uint64_t vec = 128 * 2;
  const uint64_t src_size = uint64_t{layers} * 2 * src_pool * 16 * heads * vec;
  const uint64_t dst_size = uint64_t{layers} * 2 * dst_pool * dst_tpb * heads * vec;
  c.src = Resolve(c.src_layout, src_size, false);
  c.dst = Resolve(c.dst_layout, dst_size, true);
  std::vector<uint32_t> ids(dst_pool);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const uint32_t src_blocks = Uniform(rng, 1, src_pool);
  std::vector<uint32_t> src_ids(src_pool);
  std::iota(src_ids.begin(), src_ids.end(), 0);
  std::shuffle(src_ids.begin(), src_ids.end(), rng);
  for (uint32_t i = 0; i < src_blocks; ++i) c.spec.mutable_src()->add_block_ids(src_ids[i]);
  // Every source token lands; the last destination block may be partly written.
  for (uint32_t i = 0; i < (src_blocks * 16 + dst_tpb - 1) / dst_tpb; ++i) {
    c.spec.mutable_dst()->add_block_ids(ids[i]);
  }
  static const uint64_t kTiles[] = {512, 4096, 12288, 65536, 1 << 20};
  c.options.tile_bytes = kTiles[Uniform(rng, 0, 4)];
  return c;
}

RandomCase RandomBytesCase(std::mt19937_64& rng, uint64_t max_bytes) {
  RandomCase c;
  const uint64_t n = std::uniform_int_distribution<uint64_t>(1, max_bytes)(rng);
  const uint64_t so = Coin(rng) ? 16 * Uniform(rng, 0, 64) : Uniform(rng, 0, 1000);
  const uint64_t dof = Coin(rng) ? 16 * Uniform(rng, 0, 64) : Uniform(rng, 0, 1000);
  c.spec.mutable_src()->set_byte_offset(so);
  c.spec.mutable_dst()->set_byte_offset(dof);
  c.spec.set_num_bytes(n);
  c.src = RegionView{so + n + Uniform(rng, 0, 100), false, false, {}};
  c.dst = RegionView{dof + n + Uniform(rng, 0, 100), true, false, {}};
  static const uint64_t kTiles[] = {1, 7, 64, 4096, 1 << 20};
  c.options.tile_bytes = kTiles[Uniform(rng, 0, 4)];
  return c;
}

void MakePerLayer(RandomCase& c, bool dst_side, std::mt19937_64& rng) {
  kvrail::v1::PagedKvLayout& p = dst_side ? c.dst_layout : c.src_layout;
  RegionView& view = dst_side ? c.dst : c.src;
  auto memory = std::make_shared<std::vector<uint8_t>>();
  (dst_side ? c.dst_arena : c.src_arena) = memory;
  std::vector<uint8_t>& arena = *memory;
  p.set_layer_stride(0);
  absl::StatusOr<KvLayout> k = ResolveLayout(p, UINT64_MAX, "", /*per_layer=*/true);
  if (!k.ok()) std::abort();
  const uint64_t span =
      k->offset + k->part_stride * (k->num_parts - 1) + k->block_stride * (k->num_blocks - 1) +
      k->token_stride * (k->tokens_per_block - 1) + k->head_stride * (k->num_heads - 1) +
      uint64_t{k->head_dim} * k->dtype_bytes;
  const uint64_t size = span + Uniform(rng, 0, 32);
  std::vector<uint32_t> order(k->num_layers);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const bool aligned = Coin(rng, 0.3);
  std::vector<uint64_t> at(k->num_layers);
  uint64_t end = 0;
  for (uint32_t layer : order) {
    end += aligned ? 16 * Uniform(rng, 1, 4) : Uniform(rng, 1, 64);
    at[layer] = end;
    end += aligned ? (size + 15) / 16 * 16 : size;
  }
  arena.assign(end + 64, 0);
  auto bases = std::make_shared<LayerBases>(k->num_layers);
  for (uint32_t l = 0; l < k->num_layers; ++l) {
    (*bases)[l] = reinterpret_cast<uint64_t>(arena.data()) + at[l];
  }
  absl::StatusOr<KvLayout> resolved = ResolveLayout(p, size, "", /*per_layer=*/true);
  if (!resolved.ok()) std::abort();
  view = RegionView{size, view.writable, true, *resolved, std::move(bases)};
}

void ReferenceCopy(const RandomCase& c, const uint8_t* src, uint8_t* dst) {
  const auto& spec = c.spec;
  if (!c.src.paged) {
    for (uint64_t b = 0; b < spec.num_bytes(); ++b) {
      dst[spec.dst().byte_offset() + b] = src[spec.src().byte_offset() + b];
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
    for (uint64_t p = 0; p < s.num_parts; ++p) {
      for (uint64_t i = 0; i < tokens; ++i) {
        for (uint64_t h = 0; h < heads; ++h) {
          // Per-layer sides: the layer's own address; single-base: the region base + stride.
          const uint32_t sl = static_cast<uint32_t>(spec.src().layer_begin() + l);
          const uint32_t dl = static_cast<uint32_t>(spec.dst().layer_begin() + l);
          const uint8_t* s_layer = c.src.layer_bases != nullptr
                                       ? reinterpret_cast<const uint8_t*>((*c.src.layer_bases)[sl])
                                       : src + sl * s.layer_stride;
          uint8_t* d_layer = c.dst.layer_bases != nullptr
                                 ? reinterpret_cast<uint8_t*>((*c.dst.layer_bases)[dl])
                                 : dst + dl * d.layer_stride;
          const uint64_t so = s.offset + p * s.part_stride +
                              spec.src().block_ids(i / s.tokens_per_block) * s.block_stride +
                              (i % s.tokens_per_block) * s.token_stride +
                              (spec.src().head_begin() + h) * s.head_stride;
          const uint64_t dof = d.offset + p * d.part_stride +
                               spec.dst().block_ids(i / d.tokens_per_block) * d.block_stride +
                               (i % d.tokens_per_block) * d.token_stride +
                               (spec.dst().head_begin() + h) * d.head_stride;
          for (uint64_t b = 0; b < vec; ++b) d_layer[dof + b] = s_layer[so + b];
        }
      }
    }
  }
}

std::string RandomCase::ToString() const {
  std::ostringstream o;
  o << "src{" << src_layout.ShortDebugString() << " size " << src.size_bytes
    << (src.layer_bases ? " per-layer" : "") << "} dst{" << dst_layout.ShortDebugString()
    << " size " << dst.size_bytes << (dst.layer_bases ? " per-layer" : "") << "} spec{"
    << spec.ShortDebugString() << "} tile_bytes " << options.tile_bytes;
  return o.str();
}

}  // namespace kvrail::planner::testing
