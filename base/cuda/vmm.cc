#include "base/cuda/vmm.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "base/cuda/cuda_util.h"

namespace kvrail::cuda {
namespace {

template <typename Fn>
bool Resolve(const char* name, Fn* out) {
  void* p = DriverEntryPoint(name);
  if (p == nullptr) return false;
  *out = reinterpret_cast<Fn>(p);
  return true;
}

}  // namespace

absl::StatusOr<const VmmApi*> Vmm() {
  static const VmmApi* api = []() -> const VmmApi* {
    auto* a = new VmmApi();
    const bool all =
        Resolve("cuMemImportFromShareableHandle", &a->import_handle) &&
        Resolve("cuMemExportToShareableHandle", &a->export_handle) &&
        Resolve("cuMemRetainAllocationHandle", &a->retain_handle) &&
        Resolve("cuMemRelease", &a->release) && Resolve("cuMemAddressReserve", &a->reserve) &&
        Resolve("cuMemAddressFree", &a->free_range) && Resolve("cuMemMap", &a->map) &&
        Resolve("cuMemUnmap", &a->unmap) && Resolve("cuMemSetAccess", &a->set_access) &&
        Resolve("cuPointerGetAttribute", &a->pointer_attribute);
    if (!all) {
      delete a;
      return nullptr;
    }
    return a;
  }();
  if (api == nullptr) {
    return absl::FailedPreconditionError(
        "CUDA virtual memory (cuMem*) needs the CUDA driver, which this process cannot reach");
  }
  return api;
}

absl::Status DriverStatus(CUresult result, absl::string_view what, absl::StatusCode code) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::Status(code, absl::StrCat(what, ": CUDA driver error ", static_cast<int>(result)));
}

}  // namespace kvrail::cuda
