// Pure helpers declared in kvrail_client.h: layout arithmetic and spec builders.
#include <utility>

#include "client/kvrail_client.h"
#include "proto/kvrail/v1/layout.h"

namespace kvrail::client {

uint32_t DTypeSize(v1::DType dtype) { return v1::DTypeBytes(dtype); }

absl::StatusOr<PagedStrides> ResolveStrides(const v1::PagedKvLayout& layout) {
  PagedStrides s;
  s.dtype_size = DTypeSize(layout.dtype());
  if (s.dtype_size == 0)
    return absl::InvalidArgumentError("paged_kv.dtype: unspecified or unknown");
  if (layout.num_layers() == 0 || layout.num_parts() == 0 || layout.num_blocks() == 0 ||
      layout.tokens_per_block() == 0 || layout.num_heads() == 0 || layout.head_dim() == 0) {
    return absl::InvalidArgumentError(
        "paged_kv: num_layers, num_parts, num_blocks, tokens_per_block, num_heads and head_dim "
        "must all be > 0");
  }
  if (layout.layer_stride() != 0 || layout.part_stride() != 0 || layout.block_stride() != 0 ||
      layout.token_stride() != 0 || layout.head_stride() != 0) {
    s.layer = layout.layer_stride();
    s.part = layout.part_stride();
    s.block = layout.block_stride();
    s.token = layout.token_stride();
    s.head = layout.head_stride();
    return s;
  }
  v1::LayoutStrides dense;
  if (v1::DeriveDenseStrides(layout, s.dtype_size, &dense) != v1::DeriveResult::kOk) {
    return absl::InvalidArgumentError(
        "paged_kv: strides are all zero and order is unspecified, or the layout is too large");
  }
  s.layer = dense.layer;
  s.part = dense.part;
  s.block = dense.block;
  s.token = dense.token;
  s.head = dense.head;
  return s;
}

absl::StatusOr<uint64_t> PagedLayoutBytes(const v1::PagedKvLayout& layout) {
  absl::StatusOr<PagedStrides> s = ResolveStrides(layout);
  if (!s.ok()) return s.status();
  return layout.offset_bytes() + (layout.num_layers() - 1) * s->layer +
         (layout.num_parts() - 1) * s->part + (layout.num_blocks() - 1) * s->block +
         (layout.tokens_per_block() - 1) * s->token + (layout.num_heads() - 1) * s->head +
         uint64_t{layout.head_dim()} * s->dtype_size;
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
