// ResolveLayout: the planner's view of a paged KV layout, checked by the one validator
// (layout/paged_layout.h) that the client library and the C ABI use too.
#include <string>

#include "absl/status/status.h"
#include "base/status.h"
#include "daemon/planner/planner.h"
#include "layout/paged_layout.h"

namespace kvrail::planner {

absl::StatusOr<KvLayout> ResolveLayout(const kvrail::v1::PagedKvLayout& proto, uint64_t region_size,
                                       std::string_view field_prefix) {
  return ResolveLayout(proto, region_size, field_prefix, /*per_layer=*/false);
}

absl::StatusOr<KvLayout> ResolveLayout(const kvrail::v1::PagedKvLayout& proto, uint64_t region_size,
                                       std::string_view field_prefix, bool per_layer) {
  layout::CheckOptions options;
  options.field_prefix = field_prefix;
  options.region_bytes = region_size;
  options.per_layer = per_layer;
  KVRAIL_ASSIGN_OR_RETURN(const layout::ResolvedLayout r, layout::CheckPagedLayout(proto, options));
  KvLayout k;
  k.num_layers = r.num_layers;
  k.num_parts = r.num_parts;
  k.num_blocks = r.num_blocks;
  k.tokens_per_block = r.tokens_per_block;
  k.num_heads = r.num_heads;
  k.head_dim = r.head_dim;
  k.dtype_bytes = r.dtype_bytes;
  k.dtype = r.dtype;
  k.layer_stride = r.layer_stride;
  k.part_stride = r.part_stride;
  k.block_stride = r.block_stride;
  k.token_stride = r.token_stride;
  k.head_stride = r.head_stride;
  k.offset = r.offset;
  return k;
}

}  // namespace kvrail::planner
