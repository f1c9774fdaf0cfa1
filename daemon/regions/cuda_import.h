// Internal to regions/: importing GPU memory shared by a client with a CUDA IPC handle.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::regions {

// One cudaIpcOpenMemHandle mapping, closed (cudaIpcCloseMemHandle, on its device) when the last
// region using it drops it. Immutable; safe to share across threads.
class CudaMapping {
 public:
  virtual ~CudaMapping() = default;
  // The GPU whose context holds the mapping (the accessor; the memory may live on a peer).
  virtual int device() const = 0;
  // Device address of the allocation's first byte in that context, and its size.
  virtual uint8_t* base() const = 0;
  virtual uint64_t allocation_bytes() const = 0;
};

// Imports spec.share.cuda_ipc_handle on spec.device, or returns the mapping already open for the
// same handle and device (the runtime maps a handle once per context). Checks, with errors naming
// the field: a driver and devices (FAILED_PRECONDITION spec.memory_kind, before anything else), a
// 64-byte handle (INVALID_ARGUMENT spec.share.cuda_ipc_handle), the ordinal (INVALID_ARGUMENT
// spec.device), that the handle opens (INVALID_ARGUMENT spec.share.cuda_ipc_handle), that its
// memory is on spec.device (INVALID_ARGUMENT spec.device) and that [share.offset, + size_bytes)
// fits the allocation (INVALID_ARGUMENT spec.size_bytes). Thread-safe.
absl::StatusOr<std::shared_ptr<CudaMapping>> ImportCudaIpc(const v1::RegionSpec& spec);

// The same allocation (already imported with ImportCudaIpc) mapped into GPU `accessor`'s context,
// for kernels and copies that GPU runs against a peer's memory over NVLink/PCIe. Cached like
// ImportCudaIpc; the caller keeps the result as long as it uses the address. Thread-safe.
absl::StatusOr<std::shared_ptr<CudaMapping>> ImportCudaIpcOn(const v1::RegionSpec& spec,
                                                             int accessor);

}  // namespace kvrail::regions
