// Internal to the fabric module: the host twin of the fabric kernels. A tile travels packed: its
// bytes in transfer-stream order (layer, part, token, head), the same on both sides, so the sender
// gathers with its plan's source side and the receiver scatters with its plan's destination side
// (layout conversion happens in that scatter). Pure functions; thread-safe for distinct tiles.
#pragma once

#include <cstdint>

#include "daemon/planner/planner.h"

namespace kvrail::fabric {

// Packed bytes of `tile` (= plan.tile(tile).bytes).
uint64_t TileBytes(const planner::Plan& plan, uint32_t tile);
// Gathers tile `tile` from the source region at `src_base` into `staging` (TileBytes bytes).
void PackTileHost(const planner::Plan& plan, uint32_t tile, const uint8_t* src_base,
                  uint8_t* staging);
// PackTileHost that hashes the source bytes as it gathers them (TransferSpec.digest;
// planner::ExecuteTileHostWithDigest's slices) and returns the tile's digest (kernels/digest.h).
uint64_t PackTileHostWithDigest(const planner::Plan& plan, uint32_t tile, const uint8_t* src_base,
                                uint8_t* staging);
// Scatters a packed tile from `staging` into the destination region at `dst_base`.
void UnpackTileHost(const planner::Plan& plan, uint32_t tile, const uint8_t* staging,
                    uint8_t* dst_base);

}  // namespace kvrail::fabric
