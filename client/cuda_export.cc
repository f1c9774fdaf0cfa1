#include "client/cuda_export.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/cuda/cuda_util.h"

namespace kvrail::client {
namespace {

using cuda::CudaStatus;

// The cudaMalloc allocation holding `ptr` (on the current device's context): base and size.
absl::StatusOr<std::pair<uint8_t*, uint64_t>> AllocationOf(const void* ptr) {
  absl::StatusOr<cuda::AllocationRange> range = cuda::GetAllocationRange(ptr);
  if (!range.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("device_ptr: not inside a CUDA allocation (",
                                                   range.status().message(), ")"));
  }
  return std::make_pair(reinterpret_cast<uint8_t*>(range->base), range->bytes);
}

// Makes `device` current for its lifetime and gives the caller back its own current device: the
// driver's address-range and IPC calls work on the current context only, and a library must not
// leave the caller's current device changed.
class ScopedDevice {
 public:
  static absl::StatusOr<ScopedDevice> Enter(int device) {
    int previous = 0;
    KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous), "cudaGetDevice"));
    KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
    return ScopedDevice(previous);
  }
  ScopedDevice(ScopedDevice&& other) noexcept : previous_(other.previous_) { other.previous_ = -1; }
  ScopedDevice& operator=(ScopedDevice&&) = delete;
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  explicit ScopedDevice(int previous) : previous_(previous) {}
  int previous_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

absl::StatusOr<v1::RegionSpec> MakeCudaRegionSpec(const void* device_ptr, uint64_t bytes,
                                                  v1::RegionSpec spec) {
  cudaPointerAttributes attributes{};
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaPointerGetAttributes(&attributes, device_ptr),
                       "cudaPointerGetAttributes", absl::StatusCode::kInvalidArgument));
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError("device_ptr: not device memory from cudaMalloc");
  }
  KVRAIL_ASSIGN_OR_RETURN(ScopedDevice on_device, ScopedDevice::Enter(attributes.device));
  KVRAIL_ASSIGN_OR_RETURN(auto allocation, AllocationOf(device_ptr));
  const uint64_t offset = static_cast<const uint8_t*>(device_ptr) - allocation.first;
  if (bytes == 0 || bytes > allocation.second - offset) {
    return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes, " at offset ", offset,
                                                   " do not fit the allocation of ",
                                                   allocation.second, " bytes"));
  }
  cudaIpcMemHandle_t handle;
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaIpcGetMemHandle(&handle, allocation.first), "cudaIpcGetMemHandle"));
  spec.set_memory_kind(v1::MEMORY_KIND_CUDA);
  spec.set_device(attributes.device);
  spec.set_size_bytes(bytes);
  spec.mutable_share()->set_cuda_ipc_handle(std::string(reinterpret_cast<const char*>(&handle),
                                                        sizeof(handle)));
  spec.mutable_share()->set_offset(offset);
  if (spec.layout_case() == v1::RegionSpec::LAYOUT_NOT_SET) spec.mutable_bytes();
  return spec;
}

absl::StatusOr<v1::RegionInfo> RegisterCudaRegion(Client& client, const void* device_ptr,
                                                  uint64_t bytes, v1::RegionSpec spec) {
  KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec full, MakeCudaRegionSpec(device_ptr, bytes, std::move(spec)));
  uint64_t session = 0;
  if (!client.unix_socket_path().empty()) {
    KVRAIL_ASSIGN_OR_RETURN(session, client.SessionId());
  }
  return client.RegisterRegion(std::move(full), session);
}

absl::StatusOr<v1::RegionSpec> MakeCudaLayersSpec(const std::vector<const void*>& layer_ptrs,
                                                  uint64_t layer_bytes, v1::RegionSpec spec) {
  if (layer_ptrs.empty()) return absl::InvalidArgumentError("layer_ptrs: empty");
  spec.clear_share();
  spec.clear_layer_shares();
  v1::RegionSpec out;
  for (size_t i = 0; i < layer_ptrs.size(); ++i) {
    absl::StatusOr<v1::RegionSpec> layer = MakeCudaRegionSpec(layer_ptrs[i], layer_bytes, spec);
    if (!layer.ok()) {
      return absl::Status(layer.status().code(),
                          absl::StrCat("layer_ptrs[", i, "]: ", layer.status().message()));
    }
    if (i == 0) {
      out = *layer;
      out.clear_share();
    } else if (layer->device() != out.device()) {
      return absl::InvalidArgumentError(absl::StrCat("layer_ptrs[", i, "]: on GPU",
                                                     layer->device(), ", layer 0 on GPU",
                                                     out.device(), " (one region, one GPU)"));
    }
    *out.add_layer_shares() = layer->share();
  }
  return out;
}

absl::StatusOr<v1::RegionInfo> RegisterCudaLayers(Client& client,
                                                  const std::vector<const void*>& layer_ptrs,
                                                  uint64_t layer_bytes, v1::RegionSpec spec) {
  KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec full,
                          MakeCudaLayersSpec(layer_ptrs, layer_bytes, std::move(spec)));
  uint64_t session = 0;
  if (!client.unix_socket_path().empty()) {
    KVRAIL_ASSIGN_OR_RETURN(session, client.SessionId());
  }
  return client.RegisterRegion(std::move(full), session);
}

absl::StatusOr<std::unique_ptr<CudaBuffer>> CudaBuffer::Create(int device, size_t bytes) {
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"),
                       absl::StatusCode::kFailedPrecondition));
  void* p = nullptr;
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), "cudaMalloc", absl::StatusCode::kResourceExhausted));
  return std::unique_ptr<CudaBuffer>(new CudaBuffer(device, static_cast<uint8_t*>(p), bytes));
}

CudaBuffer::~CudaBuffer() {
  cudaSetDevice(device_);
  cudaFree(data_);
}

absl::Status CudaBuffer::CopyFromHost(size_t offset, const void* src, size_t bytes) {
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  return CudaStatus(cudaMemcpy(data_ + offset, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

absl::Status CudaBuffer::CopyToHost(size_t offset, void* dst, size_t bytes) const {
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  return CudaStatus(cudaMemcpy(dst, data_ + offset, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

absl::Status CudaBuffer::Fill(uint8_t value) {
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaMemset(data_, value, size_), "cudaMemset"));
  return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace kvrail::client
