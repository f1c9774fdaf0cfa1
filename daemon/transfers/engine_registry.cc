#include "daemon/transfers/engine_registry.h"

namespace kvrail::transfers {

engine::Engine* EngineRegistry::For(scheduler::EngineKind kind) const {
  for (engine::Engine* e : engines_) {
    const engine::Capabilities caps = e->capabilities();
    if (kind == scheduler::EngineKind::kCuda ? caps.gpu_memory : caps.host_to_host) return e;
  }
  return nullptr;
}

bool EngineRegistry::MovesGpuMemory() const { return For(scheduler::EngineKind::kCuda) != nullptr; }

planner::TableAllocator* EngineRegistry::TablePool() const {
  if (engine::Engine* gpu = For(scheduler::EngineKind::kCuda))
    return gpu->capabilities().table_pool;
  return engines_.empty() ? nullptr : engines_.front()->capabilities().table_pool;
}

}  // namespace kvrail::transfers
