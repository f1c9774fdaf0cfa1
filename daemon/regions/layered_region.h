// Internal to regions/: per-layer regions (RegionSpec.layer_shares), whose layers live in
// separate allocations - vLLM and SGLang keep one KV tensor per layer, so one region (and one
// transfer) can cover every layer of a request.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/regions/cuda_import.h"
#include "daemon/regions/cuda_vmm.h"
#include "daemon/regions/host_mapping.h"
#include "daemon/regions/regions.h"
#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::regions {

// One layer's memory: a host mapping or a CUDA IPC mapping (on the region's own GPU), and the
// address of the layer's first byte in it.
struct LayerMemory {
  std::shared_ptr<Mapping> host;
  std::shared_ptr<CudaMapping> cuda;
  std::shared_ptr<VmmMapping> vmm;  // cuMem layers (also `cuda`)
  // The layer's share (for importing it again into a peer GPU's context).
  v1::RegionSpec spec;
  uint8_t* data = nullptr;
};

// The region over `layers` (one per layout layer, in order). `view` is the validated per-layer
// view; its layer_bases are filled in here from the layers' addresses. `charge` (what the region
// counts against RegionLimits) is held until the region goes.
std::shared_ptr<Region> MakeLayeredRegion(uint64_t id, uint64_t session_id, v1::RegionSpec spec,
                                          planner::RegionView view, std::vector<LayerMemory> layers,
                                          int64_t registered_us, std::shared_ptr<void> charge);

// The RegionInfo both region kinds show clients (`active` read by the caller).
v1::RegionInfo RegionInfoOf(uint64_t id, const v1::RegionSpec& spec, uint64_t session_id,
                            uint32_t active, int64_t registered_us);

// A per-layer spec's layer `index` as a spec of its own (share = layer_shares[index]), for
// importing that layer's CUDA memory.
v1::RegionSpec LayerSpec(const v1::RegionSpec& spec, int index);

}  // namespace kvrail::regions
