#include "layout/paged_layout.h"

#include <algorithm>
#include <array>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/kvrail/v1/layout.h"

namespace kvrail::layout {
namespace {

using Wide = unsigned __int128;

absl::Status Invalid(absl::string_view prefix, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(prefix, field, ": ", what));
}

// Dense strides for a named order (proto/kvrail/v1/layout.h).
absl::Status DeriveStrides(const v1::PagedKvLayout& layout, ResolvedLayout& k,
                           absl::string_view prefix) {
  v1::LayoutStrides strides;
  switch (v1::DeriveDenseStrides(layout, k.dtype_bytes, &strides)) {
    case v1::DeriveResult::kNoOrder:
      return Invalid(prefix, "order",
                     "strides are all zero and no layout order is given to derive them from");
    case v1::DeriveResult::kTooLarge:
      return Invalid(prefix, "num_blocks", "layout too large");
    case v1::DeriveResult::kOk:
      break;
  }
  k.layer_stride = strides.layer;
  k.part_stride = strides.part;
  k.block_stride = strides.block;
  k.token_stride = strides.token;
  k.head_stride = strides.head;
  return absl::OkStatus();
}

struct Dim {
  const char* field;  // the stride's field name
  uint64_t extent;
  uint64_t stride;
};

}  // namespace

absl::StatusOr<ResolvedLayout> CheckPagedLayout(const v1::PagedKvLayout& layout,
                                                const CheckOptions& options) {
  // absl here predates std::string_view interop.
  const absl::string_view p(options.field_prefix.data(), options.field_prefix.size());
  const bool per_layer = options.per_layer;
  ResolvedLayout k;
  k.num_layers = layout.num_layers();
  k.num_parts = layout.num_parts();
  k.num_blocks = layout.num_blocks();
  k.tokens_per_block = layout.tokens_per_block();
  k.num_heads = layout.num_heads();
  k.head_dim = layout.head_dim();
  k.offset = layout.offset_bytes();
  if (k.num_layers == 0) return Invalid(p, "num_layers", "must be > 0");
  if (k.num_parts != 1 && k.num_parts != 2) {
    return Invalid(p, "num_parts",
                   absl::StrCat("must be 1 (MLA) or 2 (K and V), got ", k.num_parts));
  }
  if (k.num_blocks == 0) return Invalid(p, "num_blocks", "must be > 0");
  if (k.tokens_per_block == 0) return Invalid(p, "tokens_per_block", "must be > 0");
  if (k.num_heads == 0) return Invalid(p, "num_heads", "must be > 0");
  if (k.head_dim == 0) return Invalid(p, "head_dim", "must be > 0");
  k.dtype = static_cast<int>(layout.dtype());
  k.dtype_bytes = v1::DTypeBytes(layout.dtype());
  if (k.dtype_bytes == 0) {
    return Invalid(p, "dtype",
                   absl::StrCat("unknown or unspecified dtype ", static_cast<int>(layout.dtype())));
  }

  const bool all_zero = layout.layer_stride() == 0 && layout.part_stride() == 0 &&
                        layout.block_stride() == 0 && layout.token_stride() == 0 &&
                        layout.head_stride() == 0;
  if (per_layer && layout.layer_stride() != 0) {
    return Invalid(p, "layer_stride",
                   absl::StrCat("must be 0 in a per-layer region (each layer starts at its own "
                                "base, spec.layer_shares), got ",
                                layout.layer_stride()));
  }
  if (all_zero && per_layer) {
    // Strides of one layer: the other layers are elsewhere.
    v1::PagedKvLayout one = layout;
    one.set_num_layers(1);
    if (absl::Status s = DeriveStrides(one, k, p); !s.ok()) return s;
    k.layer_stride = 0;
  } else if (all_zero) {
    if (absl::Status s = DeriveStrides(layout, k, p); !s.ok()) return s;
  } else {
    k.layer_stride = layout.layer_stride();
    k.part_stride = layout.part_stride();
    k.block_stride = layout.block_stride();
    k.token_stride = layout.token_stride();
    k.head_stride = layout.head_stride();
  }

  // Innermost first, so that among equal strides the outer dimension is the one blamed.
  std::array<Dim, 5> dims = {{{"head_stride", k.num_heads, k.head_stride},
                              {"token_stride", k.tokens_per_block, k.token_stride},
                              {"block_stride", k.num_blocks, k.block_stride},
                              {"part_stride", k.num_parts, k.part_stride},
                              {"layer_stride", per_layer ? 1u : k.num_layers, k.layer_stride}}};
  for (const Dim& d : dims) {
    if (d.stride % k.dtype_bytes != 0) {
      return Invalid(
          p, d.field,
          absl::StrCat(d.stride, " is not a multiple of the dtype size ", k.dtype_bytes));
    }
  }

  // No two head vectors may share bytes. Sound sufficient condition: sorted by stride, each
  // dimension's stride is at least the extent (in bytes) spanned by all inner dimensions.
  // Dimensions of extent 1 never move, so their strides do not matter.
  const Wide vec = Wide{k.head_dim} * k.dtype_bytes;
  std::stable_sort(dims.begin(), dims.end(),
                   [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  Wide extent = vec;  // bytes spanned by the innermost dims so far
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    if (Wide{d.stride} < extent) {
      return Invalid(
          p, d.field,
          absl::StrCat(d.stride, " makes elements overlap: the dimensions inside it span ",
                       static_cast<uint64_t>(extent), " bytes"));
    }
    extent += Wide{d.stride} * (d.extent - 1);
  }
  const Wide end = Wide{k.offset} + extent;
  const Wide capped = std::min<Wide>(end, UINT64_MAX);
  if (options.region_bytes.has_value() && end > *options.region_bytes) {
    return Invalid(p, "offset_bytes",
                   absl::StrCat("layout ends at byte ", static_cast<uint64_t>(capped),
                                ", past the region's ", *options.region_bytes, " bytes"));
  }
  if (end > UINT64_MAX) {
    return Invalid(p, "offset_bytes", "layout ends past byte 2^64");
  }
  k.end = static_cast<uint64_t>(end);
  return k;
}

}  // namespace kvrail::layout
