#include "daemon/regions/cuda_vmm.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "base/cuda/context_sync.h"
#include "base/cuda/cuda_util.h"
#include "base/cuda/vmm.h"
#include "base/logging.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kvrail::regions {
namespace {

CUmemAccessDesc ReadWrite(int device) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return desc;
}

}  // namespace

absl::StatusOr<std::shared_ptr<VmmMapping>> VmmMapping::Import(
    int device, const std::vector<std::pair<int, uint64_t>>& chunks, const std::string& field) {
  KVRAIL_ASSIGN_OR_RETURN(const cuda::VmmApi* api, cuda::Vmm());
  if (chunks.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ".chunks: empty"));
  if (chunks.size() > static_cast<size_t>(kMaxVmmChunks)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".chunks: ", chunks.size(), " chunks; at most ", kMaxVmmChunks));
  }
  uint64_t total = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].second == 0 || chunks[i].second > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".chunks[", i, "].size_bytes: ", chunks[i].second, " is not in (0, 1 TiB]"));
    }
    total += chunks[i].second;
  }
  // The driver calls below need a context: the device's primary one, for this call only.
  cuda::ScopedDevice on(device);
  KVRAIL_RETURN_IF_ERROR(on.status());
  // cudaFree and the mapping calls may synchronize the context (the CUDA engine's GPU waits).
  cuda::ContextSyncScope sync("cuMem import (cudaFree(0), cuMemMap)");
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaFree(nullptr), "cudaFree(0) (context)"));

  std::vector<std::pair<uint64_t, uint64_t>> handles;  // released on any error below
  CUdeviceptr va = 0;
  uint64_t mapped = 0;
  auto undo = [&] {
    if (mapped > 0) api->unmap(va, mapped);
    if (va != 0) api->free_range(va, total);
    for (const auto& [h, n] : handles) api->release(h);
  };
  for (size_t i = 0; i < chunks.size(); ++i) {
    CUmemGenericAllocationHandle h = 0;
    const CUresult r =
        api->import_handle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(chunks[i].first)),
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
      undo();
      return cuda::DriverStatus(
          r,
          absl::StrCat(field, ".chunks[", i,
                       "].fd_token: cuMemImportFromShareableHandle (the fd must come from "
                       "cuMemExportToShareableHandle with CU_MEM_HANDLE_TYPE_POSIX_FILE_"
                       "DESCRIPTOR)"),
          absl::StatusCode::kInvalidArgument);
    }
    handles.emplace_back(static_cast<uint64_t>(h), chunks[i].second);
  }
  if (CUresult r = api->reserve(&va, total, 0, 0, 0); r != CUDA_SUCCESS) {
    va = 0;
    undo();
    return cuda::DriverStatus(r, absl::StrCat(field, ": cuMemAddressReserve of ", total, " bytes"),
                              absl::StatusCode::kResourceExhausted);
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    const CUresult r = api->map(va + mapped, handles[i].second, 0, handles[i].first, 0);
    if (r != CUDA_SUCCESS) {
      undo();
      return cuda::DriverStatus(
          r,
          absl::StrCat(field, ".chunks[", i, "].size_bytes: cuMemMap of ", handles[i].second,
                       " bytes (the chunk's allocation is smaller, or not a multiple of the "
                       "granularity)"),
          absl::StatusCode::kInvalidArgument);
    }
    mapped += handles[i].second;
  }
  const CUmemAccessDesc desc = ReadWrite(device);
  if (CUresult r = api->set_access(va, total, &desc, 1); r != CUDA_SUCCESS) {
    undo();
    return cuda::DriverStatus(r, absl::StrCat(field, ": cuMemSetAccess for GPU", device));
  }
  auto mapping =
      std::make_shared<VmmMapping>(device, static_cast<uint64_t>(va), total, std::move(handles));
  {
    absl::MutexLock lock(&mapping->mu_);
    mapping->granted_.insert(device);
  }
  KVRAIL_DEBUG("imported {} cuMem chunks ({} bytes) on GPU{}", chunks.size(), total, device);
  return mapping;
}

VmmMapping::~VmmMapping() {
  absl::StatusOr<const cuda::VmmApi*> api = cuda::Vmm();
  if (!api.ok()) return;
  cuda::ScopedDevice on(device_);
  cuda::ContextSyncScope sync("cuMemUnmap");  // may synchronize the context
  (*api)->unmap(base_, bytes_);
  (*api)->free_range(base_, bytes_);
  for (const auto& [h, n] : handles_) (*api)->release(h);
}

absl::Status VmmMapping::GrantAccess(int accessor) {
  absl::MutexLock lock(&mu_);
  if (granted_.count(accessor) > 0) return absl::OkStatus();
  KVRAIL_ASSIGN_OR_RETURN(const cuda::VmmApi* api, cuda::Vmm());
  const CUmemAccessDesc desc = ReadWrite(accessor);
  KVRAIL_RETURN_IF_ERROR(cuda::DriverStatus(
      api->set_access(base_, bytes_, &desc, 1),
      absl::StrCat("cuMemSetAccess: GPU", accessor, " reaching cuMem memory of GPU", device_),
      absl::StatusCode::kFailedPrecondition));
  granted_.insert(accessor);
  return absl::OkStatus();
}

}  // namespace kvrail::regions
