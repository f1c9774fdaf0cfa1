// ExecuteTileHost: the host twin of the CUDA kernel. Same address arithmetic (plan_math.h), with
// memcpy of chunks; chunks that turn out adjacent on both sides are merged into one memcpy.
#include <algorithm>
#include <cstring>

#include "daemon/planner/planner.h"
#include "kernels/plan_math.h"

namespace kvrail::planner {

void ExecuteTileHost(const Plan& plan, uint32_t tile, const uint8_t* src_base, uint8_t* dst_base) {
  const kernels::PlanHeader& h = plan.header();
  ForEachTileRun(plan, tile, [&](const CopyRun& run) {
    std::memcpy(HostAddress(h.dst, dst_base, run.dst), HostAddress(h.src, src_base, run.src),
                run.bytes);
  });
}

}  // namespace kvrail::planner
