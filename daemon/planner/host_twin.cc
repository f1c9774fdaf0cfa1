// ExecuteTileHost: the host twin of the CUDA kernel. Same address arithmetic (plan_math.h), with
// memcpy of chunks; chunks that turn out adjacent on both sides are merged into one memcpy.
#include <algorithm>
#include <cstring>

#include "daemon/planner/planner.h"
#include "kernels/plan_math.h"

namespace kvrail::planner {

void ExecuteTileHost(const Plan& plan, uint32_t tile, const uint8_t* src_base, uint8_t* dst_base) {
  namespace k = ::kvrail::kernels;
  const k::PlanHeader& h = plan.header();
  const k::TileDesc t = k::TileAt(h, tile);
  if (static_cast<k::ChunkKind>(h.chunk_kind) == k::ChunkKind::kBytes) {
    std::memcpy(dst_base + h.dst.origin + t.byte_begin, src_base + h.src.origin + t.byte_begin,
                t.byte_end - t.byte_begin);
    return;
  }
  const uint32_t* sb = plan.src_blocks().data();
  const uint32_t* db = plan.dst_blocks().data();
  // The pending copy grows while the next piece continues it on both sides.
  uint64_t run_src = 0, run_dst = 0, run_len = 0;
  uint64_t pos = t.byte_begin;
  uint32_t c = static_cast<uint32_t>(pos / h.chunk_bytes);
  uint64_t r = pos % h.chunk_bytes;
  while (pos < t.byte_end) {
    const k::ChunkSpan span = k::ChunkAt(h, sb, db, t.layer, t.part, c);
    const uint64_t n = std::min(span.bytes - r, t.byte_end - pos);
    const uint64_t s = span.src + r;
    const uint64_t d = span.dst + r;
    if (run_len != 0 && run_src + run_len == s && run_dst + run_len == d) {
      run_len += n;
    } else {
      if (run_len != 0) std::memcpy(dst_base + run_dst, src_base + run_src, run_len);
      run_src = s;
      run_dst = d;
      run_len = n;
    }
    pos += n;
    ++c;
    r = 0;
  }
  if (run_len != 0) std::memcpy(dst_base + run_dst, src_base + run_src, run_len);
}

}  // namespace kvrail::planner
