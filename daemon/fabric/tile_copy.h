// Internal to the fabric module: moving one packed tile between a region and a staging slot, for
// host regions (the host twin, PackTileHost/UnpackTileHost) and GPU regions (the copy engines
// between device memory and the staging slot, which the fabric pins for the GPUs when it can).
// The run list is the same ForEachTileRun walk in both cases, so CI's host tests cover the
// arithmetic the GPU path uses. Thread contract: any thread, distinct tiles; each thread keeps its
// own CUDA stream per GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "base/cuda/cuda_util.h"
#include "daemon/planner/planner.h"

namespace kvrail::fabric {

// Where a region's bytes are: host memory, or device memory of GPU `device` (an address valid in
// that GPU's context).
struct RegionSide {
  bool cuda = false;
  int device = -1;
  uint8_t* base = nullptr;
};

// Gathers `tile` from `src` into `staging` (TileBytes bytes); returns when the bytes are there.
absl::Status PackTile(const planner::Plan& plan, uint32_t tile, const RegionSide& src,
                      uint8_t* staging);
// Scatters a packed tile from `staging` into `dst`; returns when the bytes are written.
absl::Status UnpackTile(const planner::Plan& plan, uint32_t tile, const uint8_t* staging,
                        const RegionSide& dst);

// TransferSpec.digest (issue 17): a packed tile then travels as its TileBytes followed by the
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

// [base, base + bytes) pinned for every GPU of the daemon, so copy engines reach it directly;
// nothing without GPUs. Best effort: without it the copies still work, staged by the driver.
std::optional<cuda::HostRegistration> PinForGpus(uint8_t* base, uint64_t bytes);

}  // namespace kvrail::fabric
