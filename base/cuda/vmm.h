// CUDA virtual memory management (cuMem*: cuMemCreate allocations mapped with cuMemMap) through
// the runtime's driver entry points, so nothing links libcuda and processes without a driver
// still load. Used by the client library to export cuMem memory as POSIX file descriptors and by
// kvraild to import and map it.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::cuda {

// The driver functions, resolved once (thread-safe). Each pointer is non-null in a VmmApi that
// Vmm() returned.
struct VmmApi {
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType);
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                            unsigned long long);
  CUresult (*retain_handle)(CUmemGenericAllocationHandle*, void*);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*free_range)(CUdeviceptr, size_t);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*pointer_attribute)(void*, CUpointer_attribute, CUdeviceptr);
};

// FAILED_PRECONDITION when the driver (or one of the functions) is missing.
absl::StatusOr<const VmmApi*> Vmm();

// A driver result as a Status: OK for CUDA_SUCCESS, else `code` with "what: CUDA driver error N".
absl::Status DriverStatus(CUresult result, absl::string_view what,
                          absl::StatusCode code = absl::StatusCode::kInternal);

}  // namespace kvrail::cuda
