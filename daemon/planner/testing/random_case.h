// Test support (testonly): random transfers over random layouts, and a naive reference copy that
// is written independently of the planner (straight from the proto semantics), so that both the
// host twin and the CUDA kernel can be checked against it.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "daemon/planner/planner.h"
#include "proto/kvrail/v1/region.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::planner::testing {

struct RandomCase {
  kvrail::v1::PagedKvLayout src_layout;  // unset for bytes cases
  kvrail::v1::PagedKvLayout dst_layout;
  RegionView src;
  RegionView dst;
  kvrail::v1::TransferSpec spec;
  PlanOptions options;
  // Per-layer sides (MakePerLayer): the memory holding every layer of that side; the view's
  // layer_bases point into it, and copies of the case share it. nullptr for single-base sides.
  std::shared_ptr<std::vector<uint8_t>> src_arena;
  std::shared_ptr<std::vector<uint8_t>> dst_arena;
  std::string ToString() const;  // for failure messages
};

struct RandomLimits {
  uint32_t max_blocks = 48;    // per side
  uint32_t max_head_dim = 40;  // elements
  uint32_t max_heads = 6;
  uint32_t max_layers = 4;
  uint32_t max_tpb = 16;
};

// A valid paged transfer: random dims, orders or explicit padded strides, offsets, different
// tokens per block on each side, head and layer sub-ranges, NHD <-> HND, MLA (1 part), scattered
// block tables (the source may repeat ids), random tile size.
RandomCase RandomPagedCase(std::mt19937_64& rng, const RandomLimits& limits = {});

// A transfer between serving-engine layouts: bf16, head_dim 128, 1-8 heads, 16 tokens per
// source block and 8 or 16 per destination block, NHD or HND destinations, scattered tables, tile
// sizes that are multiples of 512 bytes. Most of these take the kernel's warp path
// (kernels/plan_math.h: PieceBytesFor), which the small random cases above rarely reach.
RandomCase RandomServingCase(std::mt19937_64& rng);

// A valid bytes transfer with random offsets and length.
RandomCase RandomBytesCase(std::mt19937_64& rng, uint64_t max_bytes = 1 << 16);

// Turns one side of a paged case into a per-layer region (RegionSpec.layer_shares): layer_stride
// 0, and each layer placed in the side's arena at its own random place: distinct, not in layer
// order, never adjacent, often odd-aligned (a gap of 1-64 bytes before each) and sometimes 16-byte
// aligned. size_bytes becomes one layer's span plus random slack.
void MakePerLayer(RandomCase& c, bool dst_side, std::mt19937_64& rng);

// The naive reference: copies every element byte (l, p, i, h, d) of the transfer from `src` to
// `dst` (region bases), computing addresses from the layouts and the spec directly. A per-layer
// side's base pointer is ignored: its layer l lives at layer_bases[layer_begin + l].
void ReferenceCopy(const RandomCase& c, const uint8_t* src, uint8_t* dst);

}  // namespace kvrail::planner::testing
