// Test support (testonly): the small builders the planner's tests share: layouts, region views,
// transfer specs, and an error check naming code and message prefix (Catch2 assertions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/planner/planner.h"
#include "proto/kvrail/v1/region.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::planner::testing {

using kvrail::v1::PagedKvLayout;
using kvrail::v1::TransferSpec;

inline PagedKvLayout Proto(uint32_t layers, uint32_t parts, uint32_t blocks, uint32_t tpb,
                           uint32_t heads, uint32_t head_dim, kvrail::v1::LayoutOrder order,
                           kvrail::v1::DType dtype = kvrail::v1::DTYPE_BF16) {
  PagedKvLayout p;
  p.set_num_layers(layers);
  p.set_num_parts(parts);
  p.set_num_blocks(blocks);
  p.set_tokens_per_block(tpb);
  p.set_num_heads(heads);
  p.set_head_dim(head_dim);
  p.set_dtype(dtype);
  p.set_order(order);
  return p;
}

constexpr uint64_t kBig = uint64_t{1} << 40;

inline RegionView Paged(const PagedKvLayout& p, bool writable = true, uint64_t size = kBig) {
  absl::StatusOr<KvLayout> l = ResolveLayout(p, size, "spec.paged_kv.");
  REQUIRE(l.ok());
  return RegionView{size, writable, true, *l};
}

inline RegionView Bytes(uint64_t size, bool writable = true) {
  return RegionView{size, writable, false, {}};
}

inline bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

inline void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& prefix) {
  INFO("status: " << s.ToString());
  CHECK(s.code() == code);
  CHECK(StartsWith(std::string(s.message()), prefix));
}

inline TransferSpec Spec(std::vector<uint32_t> src_blocks, std::vector<uint32_t> dst_blocks) {
  TransferSpec spec;
  for (uint32_t b : src_blocks) spec.mutable_src()->add_block_ids(b);
  for (uint32_t b : dst_blocks) spec.mutable_dst()->add_block_ids(b);
  return spec;
}

inline const auto kNhd = kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD;
inline const auto kHnd = kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND;

// `n` source ids scattered over a pool of 2n blocks and `n` distinct destination ids counting
// down from its end.
inline TransferSpec LargeSpec(uint32_t n) {
  TransferSpec s;
  for (uint32_t b = 0; b < n; ++b) {
    s.mutable_src()->add_block_ids((b * 7919u) % (2 * n));
    s.mutable_dst()->add_block_ids(2 * n - 1 - b);
  }
  return s;
}

// A plan of `bytes` contiguous bytes between two writable byte regions of that size, in tiles of
// `tile` bytes (the engines' and records' tests).
inline Plan BytesPlan(uint64_t bytes, uint64_t tile) {
  TransferSpec spec;
  spec.set_num_bytes(bytes);
  const RegionView view = Bytes(bytes);
  PlanOptions options;
  options.tile_bytes = tile;
  absl::StatusOr<Plan> plan = MakePlan(spec, view, view, options);
  REQUIRE(plan.ok());
  return *std::move(plan);
}

}  // namespace kvrail::planner::testing
