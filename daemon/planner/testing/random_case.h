// Test support (testonly): random transfers over random layouts, and a naive reference copy that
// is written independently of the planner (straight from the proto semantics), so that both the
// host twin and the CUDA kernel can be checked against it.
#pragma once

#include <cstdint>
#include <random>
#include <string>

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
  std::string ToString() const;  // for failure messages
};

struct RandomLimits {
  uint32_t max_blocks = 48;     // per side
  uint32_t max_head_dim = 40;   // elements
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

// The naive reference: copies every element byte (l, p, i, h, d) of the transfer from `src` to
// `dst` (region bases), computing addresses from the layouts and the spec directly.
void ReferenceCopy(const RandomCase& c, const uint8_t* src, uint8_t* dst);

}  // namespace kvrail::planner::testing
