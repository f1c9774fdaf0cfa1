// Device helpers shared by the gather kernels (kv_copy.cu, kv_digest.cu): one copy of the access
// types, the plan-header load and the item split, so the digest's fused copy reads plans exactly
// as the plain copy does. Device-only, included by .cu files.
#ifndef KVRAIL_KERNELS_GATHER_COMMON_CUH_
#define KVRAIL_KERNELS_GATHER_COMMON_CUH_

#include <cstdint>

#include "kernels/device_abi.h"
#include "kernels/plan_math.h"

namespace kvrail::kernels::gather {

template <int W> struct Access;
template <> struct Access<16> { using T = int4; };
template <> struct Access<8> { using T = int2; };
template <> struct Access<4> { using T = int; };
template <> struct Access<2> { using T = short; };
template <> struct Access<1> { using T = char; };

// Copies the plan header into the CTA's shared memory (every thread reads it all the time) and
// waits for the whole CTA.
__device__ __forceinline__ void LoadHeader(const PlanHeader* __restrict__ from_header,
                                           PlanHeader* to_header) {
  const uint64_t* from = reinterpret_cast<const uint64_t*>(from_header);
  uint64_t* to = reinterpret_cast<uint64_t*>(to_header);
  for (int k = threadIdx.x; k < static_cast<int>(sizeof(PlanHeader) / 8); k += blockDim.x) {
    to[k] = from[k];
  }
  __syncthreads();
}

// Item `item` of a launch (a slab or a piece), `per_tile` items per tile: which tile of the
// launch and which item inside it. `div` divides by per_tile (MakeFastDiv), used whenever both
// fit the fast division.
struct ItemPos {
  uint64_t tile;
  uint64_t index;
};
__device__ __forceinline__ ItemPos SplitItem(uint64_t item, uint64_t per_tile,
                                             const FastDivU32& div) {
  if (item <= kFastDivMaxDividend && per_tile <= kFastDivMaxDividend) {
    const uint64_t tile = FastDiv(div, static_cast<uint32_t>(item));
    return ItemPos{tile, item - tile * per_tile};
  }
  return ItemPos{item / per_tile, item % per_tile};
}

}  // namespace kvrail::kernels::gather

#endif  // KVRAIL_KERNELS_GATHER_COMMON_CUH_
