#include "daemon/fabric/tile_pack.h"

#include <algorithm>
#include <cstring>

#include "kernels/digest.h"
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

uint64_t PackTileHostWithDigest(const planner::Plan& plan, uint32_t tile, const uint8_t* src_base,
                                uint8_t* staging) {
  // Gather then hash slice by slice while the slice is in the cache: the source is read once.
  constexpr uint64_t kSlice = 16 << 10;
  const k::TileDesc t = k::TileAt(plan.header(), tile);
  k::digest::TileHasher hasher(k::digest::WordsPerStream(plan.header().part_bytes),
                               uint64_t{t.layer} * plan.header().num_parts + t.part);
  ForEachRun<true>(plan, tile, [&](uint64_t region, uint64_t packed, uint64_t n) {
    for (uint64_t done = 0; done < n;) {
      const uint64_t m = std::min(kSlice, n - done);
      std::memcpy(staging + packed + done, src_base + region + done, m);
      hasher.Update(staging + packed + done, m, t.byte_begin + packed + done);
      done += m;
    }
  });
  return hasher.Finish();
}

void UnpackTileHost(const planner::Plan& plan, uint32_t tile, const uint8_t* staging,
                    uint8_t* dst_base) {
  ForEachRun<false>(plan, tile, [&](uint64_t region, uint64_t packed, uint64_t n) {
    std::memcpy(dst_base + region, staging + packed, n);
  });
}

}  // namespace kvrail::fabric
