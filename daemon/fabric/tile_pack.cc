#include "daemon/fabric/tile_pack.h"

#include <algorithm>
#include <cstring>

#include "kernels/plan_math.h"

namespace kvrail::fabric {
namespace {

namespace k = ::kvrail::kernels;

// Calls fn(region_offset, packed_offset, bytes) for the tile's pieces on one side, merging pieces
// adjacent in the region.
template <bool kSrcSide, typename Fn>
void ForEachRun(const planner::Plan& plan, uint32_t tile, Fn fn) {
  const k::PlanHeader& h = plan.header();
  const k::TileDesc t = k::TileAt(h, tile);
  if (static_cast<k::ChunkKind>(h.chunk_kind) == k::ChunkKind::kBytes) {
    fn((kSrcSide ? h.src.origin : h.dst.origin) + t.byte_begin, 0, t.byte_end - t.byte_begin);
    return;
  }
  const uint32_t* sb = plan.src_blocks().data();
  const uint32_t* db = plan.dst_blocks().data();
  uint64_t run_region = 0, run_packed = 0, run_len = 0;
  uint64_t pos = t.byte_begin;
  uint32_t c = static_cast<uint32_t>(pos / h.chunk_bytes);
  uint64_t r = pos % h.chunk_bytes;
  while (pos < t.byte_end) {
    const k::ChunkSpan span = k::ChunkAt(h, sb, db, t.layer, t.part, c);
    const uint64_t n = std::min(span.bytes - r, t.byte_end - pos);
    const uint64_t at = (kSrcSide ? span.src : span.dst) + r;
    if (run_len != 0 && run_region + run_len == at) {
      run_len += n;
    } else {
      if (run_len != 0) fn(run_region, run_packed, run_len);
      run_region = at;
      run_packed = pos - t.byte_begin;
      run_len = n;
    }
    pos += n;
    ++c;
    r = 0;
  }
  if (run_len != 0) fn(run_region, run_packed, run_len);
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
