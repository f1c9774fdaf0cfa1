#include "daemon/fabric/tile_pack.h"

#include <algorithm>
#include <cstring>

#include "kernels/plan_math.h"

namespace kvrail::fabric {
namespace {

namespace k = ::kvrail::kernels;

// Calls fn(region_offset, packed_offset, bytes) for the tile's runs on one side; the packed
// offset is where the run sits in the staging slot (the tile's bytes in order).
template <bool kSrcSide, typename Fn>
void ForEachRun(const planner::Plan& plan, uint32_t tile, Fn fn) {
  uint64_t packed = 0;
  planner::ForEachTileRun(plan, tile, [&](const planner::CopyRun& run) {
    fn(kSrcSide ? run.src : run.dst, packed, run.bytes);
    packed += run.bytes;
  });
}

}  // namespace

uint64_t TileBytes(const planner::Plan& plan, uint32_t tile) {
  const k::TileDesc t = k::TileAt(plan.header(), tile);
  return t.byte_end - t.byte_begin;
}

void PackTileHost(const planner::Plan& plan, uint32_t tile, const uint8_t* src_base,
                  uint8_t* staging) {
  ForEachRun<true>(plan, tile, [&](uint64_t region, uint64_t packed, uint64_t n) {
    std::memcpy(staging + packed, src_base + region, n);
  });
}

void UnpackTileHost(const planner::Plan& plan, uint32_t tile, const uint8_t* staging,
                    uint8_t* dst_base) {
  ForEachRun<false>(plan, tile, [&](uint64_t region, uint64_t packed, uint64_t n) {
    std::memcpy(dst_base + region, staging + packed, n);
  });
}

}  // namespace kvrail::fabric
