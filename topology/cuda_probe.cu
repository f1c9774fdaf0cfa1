// The CUDA runtime probe (host code only; compiled by nvcc so it sees cuda_runtime.h and links
// the static runtime). No driver or no device is an answer, not an error: zero GPUs.
#include <cuda_runtime.h>

#include <cstdio>

#include "topology/cuda_probe.h"

namespace kvrail::topology::internal {
namespace {

std::string ErrorText(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

std::string UuidText(const cudaUUID_t& uuid) {
  const unsigned char* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  bool all_zero = true;
  for (int i = 0; i < 16; ++i) all_zero = all_zero && b[i] == 0;
  if (all_zero) return "";
  char text[64];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

int Attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  if (cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) return 0;
  return value;
}

}  // namespace

CudaProbeResult RunCudaProbe() {
  CudaProbeResult result;
  cudaRuntimeGetVersion(&result.runtime_version);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    result.error = ErrorText(err);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return result;
  }
  for (int d = 0; d < count; ++d) {
    CudaGpu gpu;
    gpu.ordinal = d;
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), d) == cudaSuccess) gpu.pci_bus_id = bus;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) {
      gpu.name = prop.name;
      gpu.uuid = UuidText(prop.uuid);
      gpu.memory_bytes = prop.totalGlobalMem;
    }
    gpu.sm_count = Attribute(cudaDevAttrMultiProcessorCount, d);
    gpu.cc_major = Attribute(cudaDevAttrComputeCapabilityMajor, d);
    gpu.cc_minor = Attribute(cudaDevAttrComputeCapabilityMinor, d);
    result.gpus.push_back(gpu);
  }
  for (int a = 0; a < count; ++a) {
    for (int b = a + 1; b < count; ++b) {
      CudaPair pair;
      pair.ordinal_a = a;
      pair.ordinal_b = b;
      int ab = 0, ba = 0, atomics = 0, rank = -1;
      cudaDeviceGetP2PAttribute(&ab, cudaDevP2PAttrAccessSupported, a, b);
      cudaDeviceGetP2PAttribute(&ba, cudaDevP2PAttrAccessSupported, b, a);
      cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, a, b);
      if (cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, a, b) != cudaSuccess) {
        rank = -1;
      }
      pair.access_supported = ab != 0 && ba != 0;
      pair.atomics = atomics != 0;
      pair.perf_rank = rank;
      result.pairs.push_back(pair);
    }
  }
  cudaGetLastError();
  return result;
}

}  // namespace kvrail::topology::internal
