// Internal to the fabric module: moving one packed tile between a region and a staging slot, for
// host regions (the host twin, PackTileHost/UnpackTileHost) and GPU regions: the fabric kernels
// (GpuTileKernels below: the GPU gathers into the mapped send slot and publishes the tile's
// NicCommand itself; scatters from the mapped receive slot) or, for spec.digest and as the
// fallback, the copy engines between device memory and the slot (pinned for the GPUs).
// The run list is the same ForEachTileRun walk in both cases, so CI's host tests cover the
// arithmetic the GPU path uses. Thread contract: any thread, distinct tiles; each thread keeps its
// own CUDA stream per GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/cuda/cuda_util.h"
#include "daemon/fabric/command_ring.h"
#include "daemon/job/job.h"
#include "daemon/planner/planner.h"
#include "kernels/device_abi.h"

namespace kvrail::fabric {

// Where a region's bytes are: host memory, or device memory of GPU `device` (an address valid in
// that GPU's context). The daemon's one placement type (//daemon/job), as the fabric names it.
using RegionSide = job::Placement;

// Gathers `tile` from `src` into `staging` (TileBytes bytes); returns when the bytes are there.
absl::Status PackTile(const planner::Plan& plan, uint32_t tile, const RegionSide& src,
                      uint8_t* staging);
// Scatters a packed tile from `staging` into `dst`; returns when the bytes are written.
absl::Status UnpackTile(const planner::Plan& plan, uint32_t tile, const uint8_t* staging,
                        const RegionSide& dst);

// TransferSpec.digest: a packed tile then travels as its TileBytes followed by the
// sender's 8-byte digest of them (kernels/digest.h), so the receiver checks each tile as it lands
// (slots must hold tile_bytes + kDigestTrailerBytes).
inline constexpr uint64_t kDigestTrailerBytes = 8;
// PackTile that also hashes the tile and writes the digest after the packed bytes: host sources
// are hashed while gathering; GPU sources are gathered by the copy engines and the packed slot is
// hashed right after (the fabric has no hash kernel of its own). Returns the digest.
absl::StatusOr<uint64_t> PackTileWithDigest(const planner::Plan& plan, uint32_t tile,
                                            const RegionSide& src, uint8_t* staging);
// The digest a slot packed by PackTileWithDigest carries.
uint64_t TrailerDigest(const planner::Plan& plan, uint32_t tile, const uint8_t* staging);
// The digest of tile `tile` as the destination holds it now, read back after UnpackTile: host
// memory hashed in place, GPU memory copied back by the copy engines into `scratch` (TileBytes
// bytes; the receiver passes the tile's receive slot, pinned, once it has read the trailer) and
// hashed there.
absl::StatusOr<uint64_t> DestinationTileDigest(const planner::Plan& plan, uint32_t tile,
                                               const RegionSide& dst, uint8_t* scratch);

// This thread's CUDA stream on GPU `device` (created on first use, kept for the thread's life);
// the copy-engine paths here and the relay (relay.cc) enqueue on it and wait for it at once.
absl::StatusOr<cudaStream_t> ThreadStream(int device);

// The fabric kernels' warm-up (kernels::WarmUpFabricKernels: module load) on `stream`, once per
// GPU `device` per process (GpuTileKernels and the relay, on their plan upload).
absl::Status WarmUpFabricKernelsOnce(int device, cudaStream_t stream);

// The fabric kernels (kernels/fabric_pack.h) for one transfer's GPU side: the
// plan uploaded once to the region's GPU (on first use; the kernels' warm-up once per GPU), then
// one launch per tile on the transfer's own stream, not waited for (several tiles in flight).
// Chosen per transfer by ForSource / ForDestination, which also give the path reason; host
// regions, spec.digest (hashed on the host) and `kernels` false (fabric.gpu_pack copy; benchmarks:
// the copy engines for comparison) keep the copy-engine / host path. Thread contract: any thread;
// distinct tiles concurrently.
class GpuTileKernels {
 public:
  // For the sender: the kernel for a GPU `src` without `digest`, else nullptr. `why` gets the
  // path reason either way ("fabric pack: GPU kernel into the mapped send slot, command ring
  // written by the GPU" / "fabric pack: copy engines (spec.digest hashes on the host)" / ...).
  static std::unique_ptr<GpuTileKernels> ForSource(const planner::Plan& plan, const RegionSide& src,
                                                   bool digest, bool kernels, std::string* why);
  // For the receiver: the kernel for a GPU `dst` (spec.digest too: the read-back is separate).
  static std::unique_ptr<GpuTileKernels> ForDestination(const planner::Plan& plan,
                                                        const RegionSide& dst, bool kernels,
                                                        std::string* why);
  ~GpuTileKernels();
  GpuTileKernels(const GpuTileKernels&) = delete;
  GpuTileKernels& operator=(const GpuTileKernels&) = delete;

  // Gathers `tile` into send slot `slot` at host address `staging` and publishes its command
  // (`engine`: peer, remote_handle, transfer_tag; the producer's fields come from the plan on
  // the GPU) into `ring` at a sequence number reserved here (waiting while the ring is full).
  // Returns once the kernel is enqueued, without waiting for it (the sender keeps a
  // kernel per free send slot in flight): the transfer's kernels run in launch order on its
  // one stream; the slot's bytes and then the command (body, __threadfence_system, epoch with
  // st.release.sys) appear when the kernel ends, so a consumer that pops the command sees every
  // byte of the slot. The caller wakes the proxy at once; it keeps polling while the ring holds
  // reserved, unconsumed numbers (lanes.cc). A slot or ring the GPU cannot reach (not
  // registered): the copy engines pack and this thread pushes the command before returning
  // (same bytes, same command). An error means nothing of the tile reaches the ring (a reserved
  // number is published as kOpNone); an error of an earlier kernel of the transfer (a device
  // fault) is returned by the next call.
  absl::Status PackAndPublish(uint32_t tile, uint32_t slot, uint8_t* staging, CommandRing* ring,
                              const kernels::NicCommand& engine);
  // Waits for every kernel enqueued so far (tests).
  absl::Status Flush();
  // The receiver (several scatters in flight): enqueues the scatter of packed
  // `tile` from the receive slot at host address `staging` into the destination on the
  // transfer's stream and records an event after it; returns the ticket Poll answers for it.
  // Ticket 0: done already (an unmapped slot: the copy engines, synchronously). The slot must
  // stay untouched until Poll says done (its credit goes back then).
  absl::StatusOr<uint64_t> UnpackAsync(uint32_t tile, const uint8_t* staging);
  // Whether the scatter of `ticket` has ended: nullopt not yet; else its status (OK: every byte
  // is written), answered once per ticket (its event is reused after).
  std::optional<absl::Status> Poll(uint64_t ticket);
  // UnpackAsync and waiting for it: returns when the bytes are written.
  absl::Status Unpack(uint32_t tile, const uint8_t* staging);
  // Tiles moved by the kernel, and by the copy-engine fallback (unmapped slots).
  uint64_t kernel_tiles() const;
  uint64_t fallback_tiles() const;

 private:
  struct State;
  GpuTileKernels(const planner::Plan& plan, const RegionSide& side, bool pack);
  absl::Status EnsureUploaded();
  uint8_t* DeviceAddressOf(const void* host);  // MappedDeviceAddress, cached per slot
  const planner::Plan& plan_;                  // the transfer's (outlives this)
  const RegionSide side_;
  const bool pack_;
  std::unique_ptr<State> state_;
};

// The device address of host address `host` in memory registered with CUDA (mapped), or nullptr.
uint8_t* MappedDeviceAddress(const void* host);

// [base, base + bytes) pinned for every GPU of the daemon, so copy engines reach it directly;
// nothing without GPUs. Best effort: without it the copies still work, staged by the driver.
std::optional<cuda::HostRegistration> PinForGpus(uint8_t* base, uint64_t bytes);

}  // namespace kvrail::fabric
