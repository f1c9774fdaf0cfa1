// The C ABI's CUDA readiness flags (kvrail.h, "CUDA readiness flags") over client::CudaFlags.
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status.h"
#include "client/c_api/entry.h"
#include "client/c_api/handle_table.h"
#include "client/c_api/kvrail.h"
#include "client/cuda_flags.h"

namespace kvrail::c_api {
namespace {

HandleTable<client::CudaFlags>& Flags() {
  static auto* table = new HandleTable<client::CudaFlags>();
  return *table;
}

absl::StatusOr<std::shared_ptr<client::CudaFlags>> FindFlags(kvrail_cuda_flags* handle) {
  if (handle == nullptr) return absl::InvalidArgumentError("flags: NULL");
  std::shared_ptr<client::CudaFlags> flags = Flags().Find(HandleOf(handle));
  if (flags == nullptr) {
    return absl::InvalidArgumentError(
        "flags: not a live kvrail_cuda_flags handle (freed, or never issued)");
  }
  return flags;
}

}  // namespace
}  // namespace kvrail::c_api

using kvrail::c_api::FindFlags;
using kvrail::c_api::Flags;
using kvrail::c_api::Guard;
using kvrail::c_api::HandleFrom;
using kvrail::c_api::HandleOf;
using kvrail::c_api::RequireOut;

extern "C" {

int kvrail_cuda_flags_map(void* words, uint32_t count, int device, kvrail_cuda_flags** out) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(out, "out"));
    *out = nullptr;
    if (words == nullptr) return absl::InvalidArgumentError("words: NULL");
    if (device < 0) return absl::InvalidArgumentError("device: negative");
    // CudaFlags::Map checks alignment and count before it touches CUDA.
    KVRAIL_ASSIGN_OR_RETURN(
        std::unique_ptr<kvrail::client::CudaFlags> flags,
        kvrail::client::CudaFlags::Map(static_cast<uint32_t*>(words), count, device));
    *out = HandleFrom<kvrail_cuda_flags>(Flags().Add(std::move(flags)));
    return absl::OkStatus();
  });
}

void kvrail_cuda_flags_free(kvrail_cuda_flags* flags) {
  if (flags == nullptr) return;
  (void)Flags().Remove(HandleOf(flags));
}

int kvrail_cuda_flags_signal(kvrail_cuda_flags* handle, void* stream, uint32_t index,
                             uint32_t value) {
  return Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<kvrail::client::CudaFlags> flags, FindFlags(handle));
    return flags->SignalOnStream(static_cast<CUstream_st*>(stream), index, value);
  });
}

int kvrail_cuda_flags_wait(kvrail_cuda_flags* handle, void* stream, uint32_t index,
                           uint32_t value) {
  return Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<kvrail::client::CudaFlags> flags, FindFlags(handle));
    return flags->WaitOnStream(static_cast<CUstream_st*>(stream), index, value);
  });
}

}  // extern "C"
