// Pure helpers declared in kvrail_client.h: layout arithmetic and spec builders.
#include <utility>

#include "base/status.h"
#include "client/kvrail_client.h"
#include "layout/paged_layout.h"
#include "proto/kvrail/v1/layout.h"

namespace kvrail::client {
namespace {

// The field prefix of the client's layout errors.
constexpr char kLayoutPrefix[] = "paged_kv.";

}  // namespace

uint32_t DTypeSize(v1::DType dtype) { return v1::DTypeBytes(dtype); }

absl::StatusOr<uint64_t> CheckPagedLayout(const v1::PagedKvLayout& layout,
                                          std::optional<uint64_t> region_bytes, bool per_layer) {
  layout::CheckOptions options;
  options.field_prefix = kLayoutPrefix;
  options.region_bytes = region_bytes;
  options.per_layer = per_layer;
  KVRAIL_ASSIGN_OR_RETURN(const layout::ResolvedLayout resolved,
                          layout::CheckPagedLayout(layout, options));
  return resolved.end;
}

absl::StatusOr<PagedStrides> ResolveStrides(const v1::PagedKvLayout& layout) {
  layout::CheckOptions options;
  options.field_prefix = kLayoutPrefix;
  KVRAIL_ASSIGN_OR_RETURN(const layout::ResolvedLayout resolved,
                          layout::CheckPagedLayout(layout, options));
  PagedStrides s;
  s.layer = resolved.layer_stride;
  s.part = resolved.part_stride;
  s.block = resolved.block_stride;
  s.token = resolved.token_stride;
  s.head = resolved.head_stride;
  s.dtype_size = resolved.dtype_bytes;
  return s;
}

absl::StatusOr<uint64_t> PagedLayoutBytes(const v1::PagedKvLayout& layout) {
  return CheckPagedLayout(layout);
}

uint64_t PagedOffset(const v1::PagedKvLayout& layout, const PagedStrides& strides, uint32_t layer,
                     uint32_t part, uint32_t block, uint32_t token, uint32_t head) {
  return layout.offset_bytes() + layer * strides.layer + part * strides.part +
         block * strides.block + token * strides.token + head * strides.head;
}

v1::TransferSpec MakeBlockTransfer(uint64_t src_region, std::vector<uint32_t> src_blocks,
                                   uint64_t dst_region, std::vector<uint32_t> dst_blocks) {
  v1::TransferSpec spec;
  spec.mutable_src()->set_region_id(src_region);
  spec.mutable_src()->mutable_block_ids()->Add(src_blocks.begin(), src_blocks.end());
  spec.mutable_dst()->set_region_id(dst_region);
  spec.mutable_dst()->mutable_block_ids()->Add(dst_blocks.begin(), dst_blocks.end());
  return spec;
}

bool IsFinal(v1::TransferState state) {
  return state == v1::TRANSFER_STATE_SUCCEEDED || state == v1::TRANSFER_STATE_FAILED ||
         state == v1::TRANSFER_STATE_CANCELLED;
}

}  // namespace kvrail::client
