// ResolveLayout: derived strides and the validation of paged KV layouts.
#include <algorithm>
#include <array>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/planner/planner.h"
#include "proto/kvrail/v1/layout.h"

namespace kvrail::planner {
namespace {

using Wide = unsigned __int128;

absl::Status Invalid(absl::string_view prefix, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(prefix, field, ": ", what));
}

// Dense strides for a named order (proto/kvrail/v1/layout.h, shared with the client).
absl::Status DeriveStrides(const kvrail::v1::PagedKvLayout& proto, KvLayout& k,
                           absl::string_view prefix) {
  kvrail::v1::LayoutStrides strides;
  switch (kvrail::v1::DeriveDenseStrides(proto, k.dtype_bytes, &strides)) {
    case kvrail::v1::DeriveResult::kNoOrder:
      return Invalid(prefix, "order",
                     "strides are all zero and no layout order is given to derive them from");
    case kvrail::v1::DeriveResult::kTooLarge:
      return Invalid(prefix, "num_blocks", "layout too large");
    case kvrail::v1::DeriveResult::kOk:
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

absl::StatusOr<KvLayout> ResolveLayout(const kvrail::v1::PagedKvLayout& proto, uint64_t region_size,
                                       std::string_view field_prefix) {
  return ResolveLayout(proto, region_size, field_prefix, /*per_layer=*/false);
}

absl::StatusOr<KvLayout> ResolveLayout(const kvrail::v1::PagedKvLayout& proto, uint64_t region_size,
                                       std::string_view field_prefix, bool per_layer) {
  // absl here predates std::string_view interop.
  const absl::string_view p(field_prefix.data(), field_prefix.size());
  KvLayout k;
  k.num_layers = proto.num_layers();
  k.num_parts = proto.num_parts();
  k.num_blocks = proto.num_blocks();
  k.tokens_per_block = proto.tokens_per_block();
  k.num_heads = proto.num_heads();
  k.head_dim = proto.head_dim();
  k.offset = proto.offset_bytes();
  if (k.num_layers == 0) return Invalid(p, "num_layers", "must be > 0");
  if (k.num_parts != 1 && k.num_parts != 2) {
    return Invalid(p, "num_parts", absl::StrCat("must be 1 (MLA) or 2 (K and V), got ", k.num_parts));
  }
  if (k.num_blocks == 0) return Invalid(p, "num_blocks", "must be > 0");
  if (k.tokens_per_block == 0) return Invalid(p, "tokens_per_block", "must be > 0");
  if (k.num_heads == 0) return Invalid(p, "num_heads", "must be > 0");
  if (k.head_dim == 0) return Invalid(p, "head_dim", "must be > 0");
  k.dtype = static_cast<int>(proto.dtype());
  k.dtype_bytes = kvrail::v1::DTypeBytes(proto.dtype());
  if (k.dtype_bytes == 0) {
    return Invalid(p, "dtype", absl::StrCat("unknown or unspecified dtype ", static_cast<int>(proto.dtype())));
  }

  const bool all_zero = proto.layer_stride() == 0 && proto.part_stride() == 0 &&
                        proto.block_stride() == 0 && proto.token_stride() == 0 &&
                        proto.head_stride() == 0;
  if (per_layer && proto.layer_stride() != 0) {
    return Invalid(p, "layer_stride",
                   absl::StrCat("must be 0 in a per-layer region (each layer starts at its own "
                                "base, spec.layer_shares), got ", proto.layer_stride()));
  }
  if (all_zero && per_layer) {
    // Strides of one layer: the other layers are elsewhere.
    kvrail::v1::PagedKvLayout one = proto;
    one.set_num_layers(1);
    if (absl::Status s = DeriveStrides(one, k, p); !s.ok()) return s;
    k.layer_stride = 0;
  } else if (all_zero) {
    if (absl::Status s = DeriveStrides(proto, k, p); !s.ok()) return s;
  } else {
    k.layer_stride = proto.layer_stride();
    k.part_stride = proto.part_stride();
    k.block_stride = proto.block_stride();
    k.token_stride = proto.token_stride();
    k.head_stride = proto.head_stride();
  }

  // Innermost first, so that among equal strides the outer dimension is the one blamed.
  std::array<Dim, 5> dims = {{{"head_stride", k.num_heads, k.head_stride},
                              {"token_stride", k.tokens_per_block, k.token_stride},
                              {"block_stride", k.num_blocks, k.block_stride},
                              {"part_stride", k.num_parts, k.part_stride},
                              {"layer_stride", per_layer ? 1u : k.num_layers, k.layer_stride}}};
  for (const Dim& d : dims) {
    if (d.stride % k.dtype_bytes != 0) {
      return Invalid(p, d.field, absl::StrCat(d.stride, " is not a multiple of the dtype size ",
                                              k.dtype_bytes));
    }
  }

  // No two head vectors may share bytes. Sound sufficient condition: sorted by stride, each
  // dimension's stride is at least the extent (in bytes) spanned by all inner dimensions.
  // Dimensions of extent 1 never move, so their strides do not matter.
  const Wide vec = Wide{k.head_dim} * k.dtype_bytes;
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  Wide extent = vec;  // bytes spanned by the innermost dims so far
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    if (Wide{d.stride} < extent) {
      return Invalid(p, d.field,
                     absl::StrCat(d.stride, " makes elements overlap: the dimensions inside it span ",
                                  static_cast<uint64_t>(extent), " bytes"));
    }
    extent += Wide{d.stride} * (d.extent - 1);
  }
  if (Wide{k.offset} + extent > region_size) {
    return Invalid(p, "offset_bytes",
                   absl::StrCat("layout ends at byte ", static_cast<uint64_t>(std::min<Wide>(Wide{k.offset} + extent, UINT64_MAX)),
                                ", past the region's ", region_size, " bytes"));
  }
  return k;
}

}  // namespace kvrail::planner
