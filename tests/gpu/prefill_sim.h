// A simulated prefill layer for GPU benchmarks: a kernel of known duration that then writes the
// layer's KV bytes with a pattern the benchmark can check.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvrail::gpu_test {

inline uint8_t PrefillByte(uint64_t i, uint32_t layer, uint32_t seed) {
  return static_cast<uint8_t>((i * 131 + layer * 7 + seed) & 0xff);
}

cudaError_t LaunchPrefillLayer(uint8_t* slab, uint64_t bytes, uint32_t layer, uint32_t seed,
                               uint64_t ns, cudaStream_t stream);

}  // namespace kvrail::gpu_test
