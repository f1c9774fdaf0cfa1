// GPU memory for kvraild: export a cudaMalloc'ed pool as a region over CUDA IPC. A separate
// library (//client:cuda) so the base client needs no CUDA.
//
// Typical use (a prefill process exporting its KV pool on GPU 0):
//   KVRAIL_ASSIGN_OR_RETURN(auto pool, CudaBuffer::Create(/*device=*/0, bytes));
//   RegionSpec spec; *spec.mutable_paged_kv() = layout; spec.set_writable(true);
//   KVRAIL_ASSIGN_OR_RETURN(RegionInfo region, RegisterCudaRegion(*client, pool->data(), bytes,
//   spec));
// The daemon imports the handle on the same device ordinal: run both with the same
// CUDA_VISIBLE_DEVICES. The region lives as long as the client's session (this Client object or
// the process), or until UnregisterRegion; the daemon's mapping keeps the memory valid until its
// last transfer on the region ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "client/kvrail_client.h"
#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::client {

// Builds the spec of [device_ptr, device_ptr + bytes), which must lie in one cudaMalloc
// allocation: memory_kind CUDA, device (where the memory is), size_bytes, share.cuda_ipc_handle
// (cudaIpcGetMemHandle of the allocation's start) and share.offset (device_ptr's offset in it).
// Name, layout and writable come from `spec` (a bytes layout when none is set).
// INVALID_ARGUMENT for host pointers or ranges beyond the allocation; CUDA errors keep their text.
absl::StatusOr<v1::RegionSpec> MakeCudaRegionSpec(const void* device_ptr, uint64_t bytes,
                                                  v1::RegionSpec spec);

// MakeCudaRegionSpec, then RegisterRegion tied to the client's session (released by the daemon
// when the client or its process goes away).
absl::StatusOr<v1::RegionInfo> RegisterCudaRegion(Client& client, const void* device_ptr,
                                                  uint64_t bytes, v1::RegionSpec spec);

// A per-layer CUDA region (RegionSpec.layer_shares): layer L is [layer_ptrs[L],
// layer_ptrs[L] + layer_bytes), each inside one cudaMalloc allocation of the same GPU (vLLM's
// per-layer KV tensors). `spec` gives the paged layout (layer_stride 0), name and writable.
// Errors name layer_ptrs[i].
absl::StatusOr<v1::RegionSpec> MakeCudaLayersSpec(const std::vector<const void*>& layer_ptrs,
                                                  uint64_t layer_bytes, v1::RegionSpec spec);
absl::StatusOr<v1::RegionInfo> RegisterCudaLayers(Client& client,
                                                  const std::vector<const void*>& layer_ptrs,
                                                  uint64_t layer_bytes, v1::RegionSpec spec);

// A cudaMalloc allocation on one device, freed on destruction. Thread contract: immutable after
// creation; the copy helpers are synchronous (the device is selected on the calling thread).
class CudaBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBuffer>> Create(int device, size_t bytes);
  ~CudaBuffer();
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  absl::Status CopyFromHost(size_t offset, const void* src, size_t bytes);
  absl::Status CopyToHost(size_t offset, void* dst, size_t bytes) const;
  absl::Status Fill(uint8_t value);

 private:
  CudaBuffer(int device, uint8_t* data, size_t size) : device_(device), data_(data), size_(size) {}
  const int device_;
  uint8_t* const data_;
  const size_t size_;
};

// GPUs this process sees (0 without a driver).
int CudaDeviceCount();

}  // namespace kvrail::client
