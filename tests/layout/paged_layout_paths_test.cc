// Every case of layout/paged_layout_cases.txt through each path that validates paged layouts -
// the daemon's planner (planner::ResolveLayout), the C++ client (client::CheckPagedLayout) and
// the C ABI (kvrail_paged_layout_check, what the Python package calls) - with the same verdict,
// the same span for valid layouts and the same field blamed for invalid ones.
#include <string>

#include "catch2/catch.hpp"
#include "client/c_api/kvrail.h"
#include "client/kvrail_client.h"
#include "daemon/planner/planner.h"
#include "layout/paged_layout_cases.h"

namespace kvrail::layout {
namespace {

// What one path said of a case: its span, or the field it blamed.
struct Verdict {
  bool ok = false;
  uint64_t bytes = 0;
  std::string field;
  std::string message;
};

Verdict FromStatus(const absl::Status& status, const std::string& prefix) {
  Verdict v;
  v.message = status.ToString();
  if (status.code() == absl::StatusCode::kInvalidArgument) {
    v.field = BlamedField(std::string(status.message()), prefix);
  }
  return v;
}

Verdict Planner(const LayoutCase& c) {
  // The planner always has a region: an unbounded case gets the largest one.
  const uint64_t region = c.region_bytes.value_or(UINT64_MAX);
  absl::StatusOr<planner::KvLayout> got =
      planner::ResolveLayout(c.layout, region, "spec.paged_kv.", c.per_layer);
  if (!got.ok()) return FromStatus(got.status(), "spec.paged_kv.");
  // The planner keeps strides, not the span: the client's arithmetic over them.
  Verdict v;
  v.ok = true;
  const uint64_t layers = c.per_layer ? 1 : got->num_layers;
  v.bytes = got->offset + (layers - 1) * got->layer_stride +
            (got->num_parts - 1) * got->part_stride + (got->num_blocks - 1) * got->block_stride +
            (got->tokens_per_block - 1) * got->token_stride +
            (got->num_heads - 1) * got->head_stride + uint64_t{got->head_dim} * got->dtype_bytes;
  return v;
}

Verdict Client(const LayoutCase& c) {
  absl::StatusOr<uint64_t> got = client::CheckPagedLayout(c.layout, c.region_bytes, c.per_layer);
  if (!got.ok()) return FromStatus(got.status(), "paged_kv.");
  Verdict v;
  v.ok = true;
  v.bytes = *got;
  return v;
}

Verdict CAbi(const LayoutCase& c) {
  const v1::PagedKvLayout& l = c.layout;
  kvrail_paged_layout in{};
  in.struct_size = sizeof(in);
  in.num_layers = l.num_layers();
  in.num_parts = l.num_parts();
  in.num_blocks = l.num_blocks();
  in.tokens_per_block = l.tokens_per_block();
  in.num_heads = l.num_heads();
  in.head_dim = l.head_dim();
  in.dtype = l.dtype();
  in.order = l.order();
  in.layer_stride = l.layer_stride();
  in.part_stride = l.part_stride();
  in.block_stride = l.block_stride();
  in.token_stride = l.token_stride();
  in.head_stride = l.head_stride();
  in.offset_bytes = l.offset_bytes();
  uint64_t bytes = 0;
  const int code = kvrail_paged_layout_check(&in, c.region_bytes.value_or(0),
                                             c.per_layer ? KVRAIL_LAYOUT_PER_LAYER : 0, &bytes);
  if (code != KVRAIL_OK) {
    return FromStatus(
        absl::Status(static_cast<absl::StatusCode>(code), kvrail_last_error_message()), "layout.");
  }
  Verdict v;
  v.ok = true;
  v.bytes = bytes;
  return v;
}

TEST_CASE("the planner, the client and the C ABI judge every layout of the table alike") {
  for (const LayoutCase& c : ReadLayoutCases()) {
    for (const auto& [path, verdict] : {std::pair<const char*, Verdict>{"planner", Planner(c)},
                                        {"client", Client(c)},
                                        {"c_api", CAbi(c)}}) {
      INFO(c.name << " via " << path << ": " << verdict.message);
      if (c.bytes.has_value()) {
        REQUIRE(verdict.ok);
        CHECK(verdict.bytes == *c.bytes);
      } else {
        REQUIRE_FALSE(verdict.ok);
        CHECK(verdict.field == c.field);
      }
    }
  }
}

}  // namespace
}  // namespace kvrail::layout
