// Host side of fabric_pack.h: argument checks, launch shapes, CUDA errors as absl::Status.
#include "kernels/fabric_pack.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/fabric_pack_launch.h"
#include "kernels/plan_math.h"

namespace kvrail::kernels {
namespace {

absl::Status CudaStatus(int error, const char* what) {
  if (error == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", internal::FabricErrorName(error), ": ",
                                          internal::FabricErrorString(error)));
}

constexpr int kThreads = 512;
constexpr int kMaxCtas = 32;

absl::Status CheckTile(const DevicePlan& plan, uint32_t tile, const void* staging) {
  if (plan.header == nullptr) return absl::InvalidArgumentError("plan: not uploaded");
  if (tile >= plan.num_tiles) {
    return absl::InvalidArgumentError(
        absl::StrCat("tile ", tile, " outside the plan's ", plan.num_tiles));
  }
  if (staging == nullptr) return absl::InvalidArgumentError("staging: null");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FabricArrivals> FabricArrivals::Create(uint32_t tiles, CudaStream stream) {
  FabricArrivals a;
  a.stream_ = stream;
  const size_t bytes = std::max<size_t>(1, tiles) * sizeof(uint32_t);
  void* p = nullptr;
  if (absl::Status s = CudaStatus(internal::FabricDeviceAlloc(&p, bytes, stream),
                                  "cudaMallocAsync(fabric arrivals)");
      !s.ok()) {
    return s;
  }
  a.words_ = static_cast<uint32_t*>(p);
  if (absl::Status s = CudaStatus(internal::FabricMemsetAsync(p, bytes, stream),
                                  "cudaMemsetAsync(fabric arrivals)");
      !s.ok()) {
    return s;
  }
  return a;
}

FabricArrivals::FabricArrivals(FabricArrivals&& other) noexcept
    : words_(std::exchange(other.words_, nullptr)), stream_(other.stream_) {}

FabricArrivals::~FabricArrivals() {
  if (words_ != nullptr) internal::FabricDeviceFree(words_, stream_);
}

uint32_t FabricAccessBytes(const DevicePlan& plan, const void* staging) {
  uint32_t w = plan.access_bytes;
  while (w > 1 && reinterpret_cast<uintptr_t>(staging) % w != 0) w /= 2;
  return w;
}

int FabricCtasFor(uint64_t bytes, uint32_t access_bytes) {
  const uint64_t slab = uint64_t{kThreads} * 8 * access_bytes;
  return static_cast<int>(std::clamp<uint64_t>((bytes + slab - 1) / slab, 1, kMaxCtas));
}

absl::Status LaunchFabricPack(const DevicePlan& plan, const FabricPackTile& tile,
                              uint32_t* arrivals, CudaStream stream) {
  if (absl::Status s = CheckTile(plan, tile.tile, tile.staging); !s.ok()) return s;
  if (tile.ring_slot != nullptr && (arrivals == nullptr || tile.epoch == 0)) {
    return absl::InvalidArgumentError("a published pack needs its arrival word and an epoch > 0");
  }
  internal::FabricTileArgs a{};
  a.tile = tile.tile;
  a.slot = tile.slot;
  a.staging = tile.staging;
  a.ring_slot = tile.ring_slot;
  a.epoch = tile.epoch;
  a.arrivals = arrivals;
  a.engine = tile.engine;
  const uint32_t w = FabricAccessBytes(plan, tile.staging);
  // Every CTA of the grid arrives (one with no slab of a short tile too).
  const int ctas = FabricCtasFor(tile.bytes, w);
  return CudaStatus(
      internal::FabricTileLaunch(plan.header, a, /*pack=*/true, w, ctas, kThreads, stream),
      "fabric pack launch");
}

absl::Status LaunchFabricUnpack(const DevicePlan& plan, uint32_t tile, uint64_t bytes,
                                const uint8_t* staging, CudaStream stream) {
  if (absl::Status s = CheckTile(plan, tile, staging); !s.ok()) return s;
  internal::FabricTileArgs a{};
  a.tile = tile;
  a.staging = const_cast<uint8_t*>(staging);
  const uint32_t w = FabricAccessBytes(plan, staging);
  return CudaStatus(internal::FabricTileLaunch(plan.header, a, /*pack=*/false, w,
                                               FabricCtasFor(bytes, w), kThreads, stream),
                    "fabric unpack launch");
}

absl::Status WarmUpFabricKernels(CudaStream stream) {
  return CudaStatus(internal::FabricWarmUp(stream), "fabric kernels warm-up");
}

}  // namespace kvrail::kernels
