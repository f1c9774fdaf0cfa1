// Internal to kernels/: the nvcc-compiled entry points behind fabric_pack.h. Plain C++ (no CUDA or
// absl types); results are cudaError_t values as int (0 = success).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device_abi.h"

struct CUstream_st;

namespace kvrail::kernels::internal {

// One tile for the fabric kernels (by value as a kernel parameter).
struct FabricTileArgs {
  uint32_t tile;          // tile of the plan
  uint32_t slot;          // send slot index (NicCommand.slot); pack only
  uint8_t* staging;       // device address of the (mapped) slot holding the packed tile
  NicCommand* ring_slot;  // device address of the ring slot to publish into; null: no command
  uint32_t epoch;         // the ring lap of the reserved sequence number (written last)
  uint32_t* arrivals;     // device word counting CTAs done with this tile (0 before, 0 after)
  NicCommand engine;      // peer, remote_handle, transfer_tag to copy into the command
};

// pack: the plan's source side -> staging (then the command); unpack: staging -> destination.
int FabricTileLaunch(const PlanHeader* device_header, const FabricTileArgs& args, bool pack,
                     uint32_t access_bytes, int num_ctas, int threads, CUstream_st* stream);
// Launches each fabric kernel once on an empty tile (module load out of the first transfer).
int FabricWarmUp(CUstream_st* stream);
int FabricDeviceAlloc(void** ptr, size_t bytes, CUstream_st* stream);
int FabricDeviceFree(void* ptr, CUstream_st* stream);
int FabricMemsetAsync(void* ptr, size_t bytes, CUstream_st* stream);
const char* FabricErrorName(int error);
const char* FabricErrorString(int error);

}  // namespace kvrail::kernels::internal
