#include "proto/kvrail/v1/layout.h"

namespace kvrail::v1 {

uint32_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DTYPE_BF16:
    case DTYPE_FP16:
      return 2;
    case DTYPE_FP32:
      return 4;
    case DTYPE_FP8_E4M3:
    case DTYPE_FP8_E5M2:
    case DTYPE_INT8:
    case DTYPE_UINT8:
      return 1;
    default:
      return 0;
  }
}

DeriveResult DeriveDenseStrides(const PagedKvLayout& layout, uint32_t dtype_bytes,
                                LayoutStrides* out) {
  using Wide = unsigned __int128;
  const LayoutOrder order = layout.order();
  const Wide vec = Wide{layout.head_dim()} * dtype_bytes;
  const bool nhd = order == LAYOUT_ORDER_LAYER_PART_BLOCK_NHD ||
                   order == LAYOUT_ORDER_BLOCK_LAYER_PART_NHD ||
                   order == LAYOUT_ORDER_LAYER_BLOCK_PART_NHD;
  Wide ls = 0, ps = 0, bs = 0, ts = 0, hs = 0;
  if (nhd) {
    hs = vec;
    ts = hs * layout.num_heads();
  } else {
    ts = vec;
    hs = ts * layout.tokens_per_block();
  }
  const Wide token_block = vec * layout.num_heads() * layout.tokens_per_block();  // one (l, p, b)
  switch (order) {
    case LAYOUT_ORDER_LAYER_PART_BLOCK_NHD:
    case LAYOUT_ORDER_LAYER_PART_BLOCK_HND:
      bs = token_block;
      ps = bs * layout.num_blocks();
      ls = ps * layout.num_parts();
      break;
    case LAYOUT_ORDER_BLOCK_LAYER_PART_NHD:
    case LAYOUT_ORDER_BLOCK_LAYER_PART_HND:
      ps = token_block;
      ls = ps * layout.num_parts();
      bs = ls * layout.num_layers();
      break;
    case LAYOUT_ORDER_LAYER_BLOCK_PART_NHD:
      ps = token_block;
      bs = ps * layout.num_parts();
      ls = bs * layout.num_blocks();
      break;
    default:
      return DeriveResult::kNoOrder;
  }
  constexpr Wide kMax = UINT64_MAX;
  if (ls > kMax || bs > kMax || ps > kMax) return DeriveResult::kTooLarge;
  out->layer = static_cast<uint64_t>(ls);
  out->part = static_cast<uint64_t>(ps);
  out->block = static_cast<uint64_t>(bs);
  out->token = static_cast<uint64_t>(ts);
  out->head = static_cast<uint64_t>(hs);
  return DeriveResult::kOk;
}

}  // namespace kvrail::v1
