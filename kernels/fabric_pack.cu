// The fabric kernels (see fabric_pack.h): the sender's fused gather + command publication and the
// receiver's scatter, every address from kernels/fabric_math.h (plan_math.h underneath).
#include <cuda_runtime.h>

#include "kernels/device_abi.h"
#include "kernels/fabric_math.h"
#include "kernels/fabric_pack_launch.h"
#include "kernels/gather_common.cuh"
#include "kernels/plan_math.h"

namespace kvrail::kernels {
namespace {

constexpr int kLoadsInFlight = 8;
constexpr int kMaxThreads = 512;

using gather::Access;
using gather::LoadHeader;

// The 28 bytes before `epoch`, then `epoch` with a system-scope release: the proxy thread (on
// the CPU, polling the ring in host memory) that sees the epoch sees the body and, through the
// caller's __threadfence_system, every byte of the slot.
__device__ __forceinline__ void PublishCommand(NicCommand* to, const NicCommand& c,
                                               uint32_t epoch) {
  volatile uint32_t* words = reinterpret_cast<volatile uint32_t*>(to);
  const uint32_t* from = reinterpret_cast<const uint32_t*>(&c);
#pragma unroll
  for (int k = 0; k < 7; ++k) words[k] = from[k];
  __threadfence_system();
  asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(&to->epoch), "r"(epoch) : "memory");
}

// Grid-strides over slabs of the tile (blockDim.x * kLoadsInFlight units of W bytes in packed
// order), so a warp's slot-side accesses are consecutive bytes: whole 128-byte lines over PCIe
// into (or out of) the mapped slot. All loads of a slab are issued before its stores.
// kPack: source side -> staging, then (if asked) the last CTA to finish publishes the command.
template <int W, bool kPack>
__global__ void __launch_bounds__(kMaxThreads)
    FabricTileKernel(const PlanHeader* __restrict__ header, internal::FabricTileArgs a) {
  using T = typename Access<W>::T;
  if (a.staging == nullptr) return;  // warm-up
  __shared__ PlanHeader h;
  LoadHeader(header, &h);
  const uint32_t* __restrict__ src_blocks = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const uint32_t* __restrict__ dst_blocks = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  const SideGeometry& side = kPack ? h.src : h.dst;
  const uint64_t region = SideBase(side, side.base);
  const TileDesc t = TileAt(h, a.tile);
  const LayerSpan layer = LayerAt(h, t.layer);
  const ChunkPos start = FabricTileStart(h, t);
  const uint32_t len = static_cast<uint32_t>(t.byte_end - t.byte_begin);
  const uint32_t slab = blockDim.x * kLoadsInFlight * W;
  for (uint32_t s = blockIdx.x * slab; s < len; s += gridDim.x * slab) {
    T value[kLoadsInFlight];
    uint64_t at[kLoadsInFlight];
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t q = s + (k * blockDim.x + threadIdx.x) * W;
      if (q < len) {
        at[k] = region + FabricUnitOffset(h, src_blocks, dst_blocks, t, layer, start, q, kPack);
        value[k] =
            kPack ? *reinterpret_cast<const T*>(at[k]) : *reinterpret_cast<const T*>(a.staging + q);
      }
    }
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const uint32_t q = s + (k * blockDim.x + threadIdx.x) * W;
      if (q < len) {
        if (kPack) {
          *reinterpret_cast<T*>(a.staging + q) = value[k];
        } else {
          *reinterpret_cast<T*>(at[k]) = value[k];
        }
      }
    }
  }
  if (!kPack || a.ring_slot == nullptr) return;
  // Each thread's slot stores made visible system-wide, then one arrival per CTA; the last CTA
  // publishes (and re-arms the counter for a later pack of the same tile).
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t done = atomicAdd(a.arrivals, 1u) + 1;
    if (done == gridDim.x) {
      __threadfence();
      *a.arrivals = 0;
      PublishCommand(a.ring_slot, FabricTileCommand(h, a.tile, a.slot, a.engine), a.epoch);
    }
  }
}

template <bool kPack>
int Launch(const PlanHeader* header, const internal::FabricTileArgs& a, uint32_t access_bytes,
           int num_ctas, int threads, cudaStream_t stream) {
  switch (access_bytes) {
    case 16:
      FabricTileKernel<16, kPack><<<num_ctas, threads, 0, stream>>>(header, a);
      break;
    case 8:
      FabricTileKernel<8, kPack><<<num_ctas, threads, 0, stream>>>(header, a);
      break;
    case 4:
      FabricTileKernel<4, kPack><<<num_ctas, threads, 0, stream>>>(header, a);
      break;
    case 2:
      FabricTileKernel<2, kPack><<<num_ctas, threads, 0, stream>>>(header, a);
      break;
    case 1:
      FabricTileKernel<1, kPack><<<num_ctas, threads, 0, stream>>>(header, a);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

namespace internal {

int FabricTileLaunch(const PlanHeader* device_header, const FabricTileArgs& args, bool pack,
                     uint32_t access_bytes, int num_ctas, int threads, CUstream_st* stream) {
  if (threads <= 0 || threads > kMaxThreads || threads % 32 != 0 || num_ctas <= 0) {
    return cudaErrorInvalidValue;
  }
  return pack ? Launch<true>(device_header, args, access_bytes, num_ctas, threads, stream)
              : Launch<false>(device_header, args, access_bytes, num_ctas, threads, stream);
}

int FabricWarmUp(CUstream_st* stream) {
  FabricTileArgs none{};
  for (uint32_t w = 1; w <= 16; w *= 2) {
    for (int pack = 0; pack < 2; ++pack) {
      const int e = FabricTileLaunch(nullptr, none, pack != 0, w, 1, 32, stream);
      if (e != cudaSuccess) return e;
    }
  }
  return cudaStreamSynchronize(stream);
}

int FabricDeviceAlloc(void** ptr, size_t bytes, CUstream_st* stream) {
  return cudaMallocAsync(ptr, bytes, stream);
}
int FabricDeviceFree(void* ptr, CUstream_st* stream) { return cudaFreeAsync(ptr, stream); }
int FabricMemsetAsync(void* ptr, size_t bytes, CUstream_st* stream) {
  return cudaMemsetAsync(ptr, 0, bytes, stream);
}
const char* FabricErrorName(int error) { return cudaGetErrorName(static_cast<cudaError_t>(error)); }
const char* FabricErrorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // namespace internal
}  // namespace kvrail::kernels
