// The fabric kernels (arithmetic in fabric_math.h, host twin there too):
// - pack: gathers tile `tile` of a plan from the GPU source region straight into its send slot
//   (pinned host memory registered with CUDA and mapped: the kernel stores through the slot's
//   device address) and then, in the same launch, publishes the tile's 32-byte NicCommand into
//   the NIC's command ring (also mapped host memory): the body, __threadfence_system, then the
//   epoch with st.release.sys. The ring's sequence number is reserved by the host before the
//   launch (CommandRing::Reserve), so the GPU needs no atomics on host memory; the proxy thread
//   only polls the ring and posts.
// - unpack: scatters a packed tile from a (mapped) receive slot into the GPU destination region,
//   converting the layout (the receiver's plan's destination side).
// Plans are uploaded with kv_copy.h's DevicePlanBuffer (the region's device address on its side,
// 0 on the other: only one side is dereferenced).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_abi.h"
#include "kernels/kv_copy.h"

namespace kvrail::kernels {

// Per-tile CTA arrival counters in device memory (zeroed; each tile's returns to 0 after its
// pack published). Stream-ordered like DevicePlanBuffer: keep it while its stream lives.
class FabricArrivals {
 public:
  static absl::StatusOr<FabricArrivals> Create(uint32_t tiles, CudaStream stream);
  FabricArrivals(FabricArrivals&& other) noexcept;
  FabricArrivals& operator=(FabricArrivals&& other) = delete;
  FabricArrivals(const FabricArrivals&) = delete;
  ~FabricArrivals();
  uint32_t* at(uint32_t tile) const { return words_ + tile; }

 private:
  FabricArrivals() = default;
  uint32_t* words_ = nullptr;
  CudaStream stream_ = nullptr;
};

// One tile to pack and publish.
struct FabricPackTile {
  uint32_t tile = 0;
  uint32_t slot = 0;                // send slot index (goes into the command)
  uint64_t bytes = 0;               // the tile's packed length (sizes the grid; > 0)
  uint8_t* staging = nullptr;       // device address of the send slot
  NicCommand* ring_slot = nullptr;  // device address of ring slot seq % capacity; null: no command
  uint32_t epoch = 0;               // CommandRing::EpochOf(seq)
  NicCommand engine{};              // peer, remote_handle, transfer_tag
};

// The unit width the fabric kernels use for `plan` with a slot at `staging` (the plan's access
// width narrowed to the slot's alignment).
uint32_t FabricAccessBytes(const DevicePlan& plan, const void* staging);
// CTAs for a tile of `bytes` (one per 64 KiB slab at 16-byte units, at most 32).
int FabricCtasFor(uint64_t bytes, uint32_t access_bytes);

// Enqueues the pack kernel for one tile on `stream` (the slot's bytes and, when ring_slot is set,
// the command are written when the kernel ends). `arrivals` from FabricArrivals::at(tile).
absl::Status LaunchFabricPack(const DevicePlan& plan, const FabricPackTile& tile,
                              uint32_t* arrivals, CudaStream stream);
// Enqueues the unpack kernel: tile `tile` (`bytes` packed bytes), packed at device address
// `staging`, into the plan's destination.
absl::Status LaunchFabricUnpack(const DevicePlan& plan, uint32_t tile, uint64_t bytes,
                                const uint8_t* staging, CudaStream stream);
// Loads the fabric kernels on the current device and waits (see WarmUpKvCopy).
absl::Status WarmUpFabricKernels(CudaStream stream);

}  // namespace kvrail::kernels
