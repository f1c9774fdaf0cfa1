// Internal to topology/: the CUDA runtime probe. Compiled by nvcc (cuda_probe.cu), so this
// interface uses only the standard library: no protobuf, no absl.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvrail::topology::internal {

struct CudaGpu {
  int ordinal = 0;
  std::string pci_bus_id;  // as cudaDeviceGetPCIBusId writes it, e.g. "0000:18:00.0"
  std::string name;
  std::string uuid;  // "GPU-xxxxxxxx-..." or empty
  uint64_t memory_bytes = 0;
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
};

struct CudaPair {
  int ordinal_a = 0;
  int ordinal_b = 0;
  bool access_supported = false;  // cudaDevP2PAttrAccessSupported both ways
  bool atomics = false;           // cudaDevP2PAttrNativeAtomicSupported
  int perf_rank = -1;             // cudaDevP2PAttrPerformanceRank (a -> b)
};

struct CudaProbeResult {
  // Empty when the runtime answered; else why there are no GPUs ("cudaErrorNoDevice: ...").
  std::string error;
  int runtime_version = 0;
  std::vector<CudaGpu> gpus;
  std::vector<CudaPair> pairs;  // every unordered pair, ordinal_a < ordinal_b
};

// Never fails: no driver or no device gives an empty list and `error`.
CudaProbeResult RunCudaProbe();

}  // namespace kvrail::topology::internal
