// The one list of engines a transfer manager runs local transfers on. Each engine declares what
// it moves (engine::Capabilities); the manager picks, drains, counts and describes engines only
// through this list. A new engine is its folder under //daemon/engine and one Add line where the
// daemon makes its engines (daemon/daemon.cc).
#pragma once

#include <vector>

#include "daemon/engine/engine.h"
#include "daemon/planner/planner.h"
#include "daemon/scheduler/route.h"

namespace kvrail::transfers {

// Thread-compatible while being filled; read-only once a manager has it (then any thread).
class EngineRegistry {
 public:
  EngineRegistry() = default;
  explicit EngineRegistry(std::vector<engine::Engine*> engines) {
    for (engine::Engine* e : engines) Add(e);
  }

  // Registers `engine` (not owned: it outlives every manager using the registry); null is
  // ignored, so an engine the daemon could not make is simply not there.
  void Add(engine::Engine* engine) {
    if (engine != nullptr) engines_.push_back(engine);
  }

  // The engine that runs a transfer the route gave to `kind`: host-to-host transfers need one
  // that moves host memory, transfers with a GPU side one that moves GPU memory. The first
  // registered wins; nullptr: none.
  engine::Engine* For(scheduler::EngineKind kind) const;
  // Whether some engine moves GPU memory (else GPU regions are refused by the route).
  bool MovesGpuMemory() const;
  // Where local plans keep their block tables (PlanOptions.tables): the pool of the first engine
  // that moves GPU memory, since any local plan may run there and its tables go where it uploads
  // them from without staging; without one, the first engine's. nullptr: any memory.
  planner::TableAllocator* TablePool() const;
  // Every registered engine, in the order registered.
  const std::vector<engine::Engine*>& engines() const { return engines_; }

 private:
  std::vector<engine::Engine*> engines_;
};

}  // namespace kvrail::transfers
