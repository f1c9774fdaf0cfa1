// The validator over the shared table of layouts (paged_layout_cases.txt): each valid case's
// span, each invalid case's field; and the resolved strides of a dense and a per-layer layout.
#include "layout/paged_layout.h"

#include "catch2/catch.hpp"
#include "layout/paged_layout_cases.h"

namespace kvrail::layout {
namespace {

CheckOptions Options(const LayoutCase& c, std::string_view prefix) {
  CheckOptions o;
  o.field_prefix = prefix;
  o.region_bytes = c.region_bytes;
  o.per_layer = c.per_layer;
  return o;
}

TEST_CASE("every case of the table gets its verdict and field") {
  for (const LayoutCase& c : ReadLayoutCases()) {
    INFO(c.name);
    absl::StatusOr<ResolvedLayout> got = CheckPagedLayout(c.layout, Options(c, "spec.paged_kv."));
    INFO(got.status().ToString());
    if (c.bytes.has_value()) {
      REQUIRE(got.ok());
      CHECK(got->end == *c.bytes);
    } else {
      REQUIRE(got.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(BlamedField(std::string(got.status().message()), "spec.paged_kv.") == c.field);
    }
  }
}

TEST_CASE("strides are derived from the order, per layer without the layer stride") {
  v1::PagedKvLayout l;
  l.set_num_layers(2);
  l.set_num_parts(2);
  l.set_num_blocks(8);
  l.set_tokens_per_block(16);
  l.set_num_heads(4);
  l.set_head_dim(64);
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  absl::StatusOr<ResolvedLayout> dense = CheckPagedLayout(l, {});
  REQUIRE(dense.ok());
  CHECK(dense->head_stride == 128);
  CHECK(dense->token_stride == 512);
  CHECK(dense->block_stride == 8192);
  CHECK(dense->part_stride == 65536);
  CHECK(dense->layer_stride == 131072);
  CHECK(dense->dtype_bytes == 2);
  CheckOptions per_layer;
  per_layer.per_layer = true;
  absl::StatusOr<ResolvedLayout> one = CheckPagedLayout(l, per_layer);
  REQUIRE(one.ok());
  CHECK(one->layer_stride == 0);
  CHECK(one->part_stride == 65536);
  CHECK(one->end == 131072);
}

}  // namespace
}  // namespace kvrail::layout
