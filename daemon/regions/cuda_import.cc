#include "daemon/regions/cuda_import.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/cuda/context_sync.h"
#include "base/cuda/cuda_util.h"
#include "base/logging.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kvrail::regions {
namespace {

// Thread-safe: immutable; closed by whichever thread drops the last reference.
class CudaMappingImpl final : public CudaMapping {
 public:
  CudaMappingImpl(int device, uint8_t* base, uint64_t bytes)
      : device_(device), base_(base), bytes_(bytes) {}
  ~CudaMappingImpl() override {
    // The mapping belongs to the device's context: select it on this (any) thread for the close
    // only. The last reference may go on a dispatcher serving another GPU, whose later events
    // and launches must still go to its own GPU.
    cuda::ScopedDevice on(device_);
    absl::Status s = on.status();
    if (s.ok()) {
      cuda::ContextSyncScope sync("cudaIpcCloseMemHandle");  // context-synchronizing
      s = cuda::CudaStatus(cudaIpcCloseMemHandle(base_), "cudaIpcCloseMemHandle");
    }
    if (!s.ok()) spdlog::warn("closing a CUDA IPC mapping on GPU{}: {}", device_, s.ToString());
    if (s.ok()) KVRAIL_DEBUG("closed CUDA IPC mapping on GPU{} ({} bytes)", device_, bytes_);
  }
  int device() const override { return device_; }
  uint8_t* base() const override { return base_; }
  uint64_t allocation_bytes() const override { return bytes_; }

 private:
  const int device_;
  uint8_t* const base_;
  const uint64_t bytes_;
};

// Open mappings by (device, handle bytes), so two regions over one allocation share a mapping.
// Thread-safe: open is guarded by mu, which Cached holds across the open itself so one handle is
// never opened twice in one context.
struct Cache {
  absl::Mutex mu;
  std::map<std::pair<int, std::string>, std::weak_ptr<CudaMapping>> open ABSL_GUARDED_BY(mu);
};

Cache& TheCache() {
  static Cache* cache = new Cache();
  return *cache;
}

// Opens the handle in `accessor`'s context; the memory must live on GPU `holder`. A peer GPU's
// kernels and copies reach the memory only through a mapping opened in their own context
// (cudaIpcMemLazyEnablePeerAccess), not through the holder's mapping: peer access enabled later
// does not extend to IPC imports of the holder's context (seen on 2xH200 as illegal addresses).
absl::StatusOr<std::shared_ptr<CudaMapping>> Open(int accessor, int holder,
                                                  const std::string& handle_bytes) {
  // For the open (and a close on failure) only: the calling thread keeps its own device.
  cuda::ScopedDevice on(accessor);
  KVRAIL_RETURN_IF_ERROR(on.status());
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, handle_bytes.data(), sizeof(handle));
  void* ptr = nullptr;
  cudaError_t e;
  {
    cuda::ContextSyncScope sync("cudaIpcOpenMemHandle");  // context-synchronizing
    e = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess);
  }
  if (e != cudaSuccess) {
    return cuda::CudaStatus(
        e,
        absl::StrCat("spec.share.cuda_ipc_handle: cudaIpcOpenMemHandle on GPU", accessor,
                     " failed (the exporting process must be alive and the handle come from "
                     "cudaIpcGetMemHandle on a cudaMalloc allocation)"),
        absl::StatusCode::kInvalidArgument);
  }
  auto mapping_or_error = [&]() -> absl::StatusOr<std::shared_ptr<CudaMapping>> {
    KVRAIL_ASSIGN_OR_RETURN(int where, cuda::PointerDevice(ptr));
    KVRAIL_ASSIGN_OR_RETURN(cuda::AllocationRange range, cuda::GetAllocationRange(ptr));
    // The runtime reports a peer view's pointer on the accessor's device, so the holder can be
    // checked only for the holder's own mapping (which every view follows).
    if (accessor == holder && where != holder) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.device: the handle's memory is on GPU", where, ", not GPU", holder));
    }
    return std::shared_ptr<CudaMapping>(
        std::make_shared<CudaMappingImpl>(accessor, static_cast<uint8_t*>(ptr), range.bytes));
  }();
  if (!mapping_or_error.ok()) {
    cuda::ContextSyncScope sync("cudaIpcCloseMemHandle");
    cudaIpcCloseMemHandle(ptr);
  }
  return mapping_or_error;
}

// The cached mapping of `handle` in `accessor`'s context, opened on first use.
absl::StatusOr<std::shared_ptr<CudaMapping>> Cached(int accessor, int holder,
                                                    const std::string& handle) {
  Cache& cache = TheCache();
  absl::MutexLock lock(&cache.mu);
  std::shared_ptr<CudaMapping> mapping;
  auto key = std::make_pair(accessor, handle);
  auto it = cache.open.find(key);
  if (it != cache.open.end()) mapping = it->second.lock();
  if (mapping == nullptr) {
    KVRAIL_ASSIGN_OR_RETURN(mapping, Open(accessor, holder, handle));
    cache.open[key] = mapping;
  }
  for (auto e = cache.open.begin(); e != cache.open.end();) {  // forget closed mappings
    if (e->second.expired()) {
      e = cache.open.erase(e);
    } else {
      ++e;
    }
  }
  return mapping;
}

}  // namespace

absl::StatusOr<std::shared_ptr<CudaMapping>> ImportCudaIpc(const v1::RegionSpec& spec) {
  absl::StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("spec.memory_kind: MEMORY_KIND_CUDA needs a CUDA device and this daemon has "
                     "none (",
                     count.status().message(), ")"));
  }
  if (spec.share().via_case() != v1::RegionShare::kCudaIpcHandle) {
    return absl::InvalidArgumentError(
        "spec.share.cuda_ipc_handle: MEMORY_KIND_CUDA regions are shared with a CUDA IPC handle");
  }
  const std::string& handle = spec.share().cuda_ipc_handle();
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("spec.share.cuda_ipc_handle: must be ",
                                                   sizeof(cudaIpcMemHandle_t), " bytes, got ",
                                                   handle.size()));
  }
  if (spec.device() < 0 || spec.device() >= *count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.device: GPU", spec.device(), " does not exist (this daemon sees ", *count, " GPUs)"));
  }
  KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<CudaMapping> mapping,
                          Cached(spec.device(), spec.device(), handle));
  const uint64_t offset = spec.share().offset();
  if (offset > mapping->allocation_bytes() ||
      spec.size_bytes() > mapping->allocation_bytes() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.size_bytes: region [", offset, ", ", offset + spec.size_bytes(),
        ") does not fit the CUDA allocation of ", mapping->allocation_bytes(), " bytes"));
  }
  return mapping;
}

absl::StatusOr<std::shared_ptr<CudaMapping>> ImportCudaIpcOn(const v1::RegionSpec& spec,
                                                             int accessor) {
  if (accessor == spec.device()) return ImportCudaIpc(spec);
  KVRAIL_ASSIGN_OR_RETURN(int count, cuda::DeviceCount());
  if (accessor < 0 || accessor >= count) {
    return absl::InvalidArgumentError(absl::StrCat("GPU", accessor, " does not exist"));
  }
  return Cached(accessor, spec.device(), spec.share().cuda_ipc_handle());
}

}  // namespace kvrail::regions
