#include <cuda_runtime.h>

#include "tests/gpu/prefill_sim.h"

namespace kvrail::gpu_test {
namespace {

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins `ns` (the layer's compute), then writes the layer's bytes: byte i of layer `layer` is
// (i * 131 + layer * 7 + seed) & 0xff.
__global__ void PrefillLayer(uint8_t* slab, uint64_t bytes, uint32_t layer, uint32_t seed,
                             uint64_t ns) {
  const uint64_t start = GlobalTimer();
  while (GlobalTimer() - start < ns) {
  }
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += stride) {
    slab[i] = static_cast<uint8_t>((i * 131 + layer * 7 + seed) & 0xff);
  }
}

}  // namespace

cudaError_t LaunchPrefillLayer(uint8_t* slab, uint64_t bytes, uint32_t layer, uint32_t seed,
                               uint64_t ns, cudaStream_t stream) {
  PrefillLayer<<<264, 512, 0, stream>>>(slab, bytes, layer, seed, ns);
  return cudaGetLastError();
}

}  // namespace kvrail::gpu_test
