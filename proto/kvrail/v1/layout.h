// Pure helpers over the v1 layout messages, shared by the daemon's planner and the client library
// so both derive the same strides (the client sizes its buffers with them, the daemon checks
// them): element sizes and the dense strides of each LayoutOrder.
#pragma once

#include <cstdint>

#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::v1 {

// Bytes per element of `dtype`; 0 for DTYPE_UNSPECIFIED and unknown values.
uint32_t DTypeBytes(DType dtype);

// Byte strides of a paged KV layout.
struct LayoutStrides {
  uint64_t layer = 0, part = 0, block = 0, token = 0, head = 0;
};

enum class DeriveResult { kOk, kNoOrder, kTooLarge };

// The densely packed strides of `layout.order()` (head_dim innermost, names outermost first)
// for a vector of head_dim * dtype_bytes bytes. kNoOrder for LAYOUT_ORDER_UNSPECIFIED or unknown
// orders; kTooLarge when a stride would not fit 64 bits. Dimensions are taken as given (callers
// validate them first).
DeriveResult DeriveDenseStrides(const PagedKvLayout& layout, uint32_t dtype_bytes,
                                LayoutStrides* out);

}  // namespace kvrail::v1
