// Shared by fault_test and its fault_client helper: the layout of the layer-wise producer case
// and the pattern the producer writes (header only).
#pragma once

#include <cstdint>

#include "tests/harness/daemon_process.h"

namespace kvrail::testing {

inline constexpr uint32_t kFaultBlocks = 8;

// `layers` layers, 2 parts, 16 blocks of 16 tokens, 4 heads of 64 bf16.
inline v1::PagedKvLayout FaultLayout(uint32_t layers) {
  return MakeLayout(layers, 2, 16, 16, 4, 64, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

// PatternByte(77, ...) for every element of blocks [0, kFaultBlocks).
inline void FillFaultPattern(const v1::PagedKvLayout& l, uint8_t* base) {
  const uint32_t vec = l.head_dim() * 2;
  for (uint32_t layer = 0; layer < l.num_layers(); ++layer) {
    for (uint32_t part = 0; part < l.num_parts(); ++part) {
      for (uint64_t t = 0; t < uint64_t{kFaultBlocks} * l.tokens_per_block(); ++t) {
        const uint32_t block = static_cast<uint32_t>(t / l.tokens_per_block());
        const uint32_t slot = static_cast<uint32_t>(t % l.tokens_per_block());
        for (uint32_t h = 0; h < l.num_heads(); ++h) {
          uint8_t* p = base + ElementOffset(l, layer, part, block, slot, h);
          for (uint32_t b = 0; b < vec; ++b) p[b] = PatternByte(77, layer, part, t, h, b);
        }
      }
    }
  }
}

}  // namespace kvrail::testing
