#include "client/cuda_flags.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "base/cuda/cuda_util.h"

namespace kvrail::client {
namespace {

using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

class CudaFlagsImpl final : public CudaFlags {
 public:
  CudaFlagsImpl(uint32_t* words, uint32_t count, int device, CUdeviceptr device_words,
                WriteValue32 write, WaitValue32 wait, bool owns_registration)
      : words_(words),
        count_(count),
        device_(device),
        device_words_(device_words),
        write_(write),
        wait_(wait),
        owns_registration_(owns_registration) {}
  ~CudaFlagsImpl() override {
    if (!owns_registration_) return;
    // The caller's current device stays current (a destructor must not move its thread).
    cuda::ScopedDevice on(device_);
    cudaHostUnregister(words_);
  }

  absl::Status SignalOnStream(CUstream_st* stream, uint32_t index, uint32_t value) override {
    if (index >= count_)
      return absl::OutOfRangeError(absl::StrCat("flag index ", index, " >= ", count_));
    const CUresult r = write_(stream, device_words_ + 4ull * index, value, 0);
    if (r != CUDA_SUCCESS)
      return absl::InternalError(absl::StrCat("cuStreamWriteValue32: CUresult ", r));
    return absl::OkStatus();
  }

  absl::Status WaitOnStream(CUstream_st* stream, uint32_t index, uint32_t value) override {
    if (index >= count_)
      return absl::OutOfRangeError(absl::StrCat("flag index ", index, " >= ", count_));
    const CUresult r = wait_(stream, device_words_ + 4ull * index, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
      return absl::InternalError(absl::StrCat("cuStreamWaitValue32: CUresult ", r));
    return absl::OkStatus();
  }

 private:
  uint32_t* const words_;
  const uint32_t count_;
  const int device_;
  const CUdeviceptr device_words_;
  const WriteValue32 write_;
  const WaitValue32 wait_;
  const bool owns_registration_;  // false when the memory was already registered (by another map)
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaFlags>> CudaFlags::Map(uint32_t* words, uint32_t count,
                                                          int device) {
  if (reinterpret_cast<uintptr_t>(words) % 4 != 0 || count == 0) {
    return absl::InvalidArgumentError("flag words must be 4-byte aligned and at least one");
  }
  // Registered on `device` for this call only; the caller's current device is restored.
  cuda::ScopedDevice on(device);
  if (!on.status().ok()) return on.status();
  cudaError_t e =
      cudaHostRegister(words, 4ull * count, cudaHostRegisterMapped | cudaHostRegisterPortable);
  // Memory inside an earlier (portable) registration is already mapped for every GPU.
  const bool owns = e == cudaSuccess;
  if (e == cudaErrorHostMemoryAlreadyRegistered) {
    (void)cudaGetLastError();
  } else if (e != cudaSuccess) {
    return cuda::CudaStatus(e, "cudaHostRegister(flag words)");
  }
  void* device_words = nullptr;
  e = cudaHostGetDevicePointer(&device_words, words, 0);
  if (e != cudaSuccess) {
    if (owns) cudaHostUnregister(words);
    return cuda::CudaStatus(e, "cudaHostGetDevicePointer(flag words)");
  }
  // Driver entry points through the runtime, so nothing links libcuda directly.
  void* write = cuda::DriverEntryPoint("cuStreamWriteValue32");
  void* wait = cuda::DriverEntryPoint("cuStreamWaitValue32");
  if (write == nullptr || wait == nullptr) {
    if (owns) cudaHostUnregister(words);
    return absl::FailedPreconditionError(
        "the driver offers no cuStreamWriteValue32/cuStreamWaitValue32");
  }
  return std::unique_ptr<CudaFlags>(std::make_unique<CudaFlagsImpl>(
      words, count, device, reinterpret_cast<CUdeviceptr>(device_words),
      reinterpret_cast<WriteValue32>(write), reinterpret_cast<WaitValue32>(wait), owns));
}

}  // namespace kvrail::client
