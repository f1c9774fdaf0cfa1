// The one validator of paged KV layouts (kvrail.v1.PagedKvLayout). The daemon's planner checks
// every paged region with it, the client library sizes and checks layouts with it, and the C ABI
// (kvrail_paged_layout_check) gives the Python package the same verdicts, so a layout is valid
// or invalid - and blamed on the same field - wherever it is checked.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::layout {

// A paged KV layout with every value resolved (strides derived when the proto gave none).
struct ResolvedLayout {
  uint32_t num_layers = 0;
  uint32_t num_parts = 0;
  uint32_t num_blocks = 0;
  uint32_t tokens_per_block = 0;
  uint32_t num_heads = 0;
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 0;
  int dtype = 0;  // kvrail.v1.DType number
  uint64_t layer_stride = 0;
  uint64_t part_stride = 0;
  uint64_t block_stride = 0;
  uint64_t token_stride = 0;
  uint64_t head_stride = 0;
  uint64_t offset = 0;
  // offset + the bytes spanned by every element (of one layer, for a per-layer layout): what a
  // region (one layer's span) must hold.
  uint64_t end = 0;
};

struct CheckOptions {
  // Errors are INVALID_ARGUMENT "<field_prefix><field>: <what>", e.g. "spec.paged_kv.part_stride:
  // ...". The field is the PagedKvLayout field blamed.
  std::string_view field_prefix;
  // The bytes the layout must fit (one layer's span for a per-layer layout); none: only that it
  // ends within 2^64 bytes.
  std::optional<uint64_t> region_bytes;
  // A per-layer region (RegionSpec.layer_shares): every layer starts at its own base, so
  // layer_stride must be 0 (all strides 0 derive the others as for one layer) and the layers are
  // not checked against each other.
  bool per_layer = false;
};

// Checks, in this order: num_layers > 0, num_parts 1 or 2, num_blocks, tokens_per_block,
// num_heads and head_dim > 0, a known dtype, layer_stride 0 when per_layer, an order when every
// stride is 0 (then derived, densely packed), strides that are multiples of the dtype size
// (innermost first), no two head vectors sharing bytes (the outer of two equal strides is
// blamed), and offset_bytes + the span within region_bytes.
absl::StatusOr<ResolvedLayout> CheckPagedLayout(const v1::PagedKvLayout& layout,
                                                const CheckOptions& options);

}  // namespace kvrail::layout
