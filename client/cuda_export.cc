#include "client/cuda_export.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/cuda/cuda_util.h"
#include "base/cuda/vmm.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace kvrail::client {
namespace {

using cuda::CudaStatus;

// The cudaMalloc allocation holding `ptr` (on the current device's context): base and size.
absl::StatusOr<std::pair<uint8_t*, uint64_t>> AllocationOf(const void* ptr) {
  absl::StatusOr<cuda::AllocationRange> range = cuda::GetAllocationRange(ptr);
  if (!range.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_ptr: not inside a CUDA allocation (", range.status().message(), ")"));
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
    KVRAIL_RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
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

// A pointer attribute read into a zeroed 8-byte word (the driver writes 4 or 8 bytes; little
// endian, so either reads right).
absl::StatusOr<uint64_t> Attribute(const cuda::VmmApi& api, CUpointer_attribute what,
                                   const void* ptr, const char* name) {
  uint64_t value = 0;
  KVRAIL_RETURN_IF_ERROR(
      cuda::DriverStatus(api.pointer_attribute(&value, what, reinterpret_cast<CUdeviceptr>(ptr)),
                         absl::StrCat("device_ptr: cuPointerGetAttribute(", name, ")"),
                         absl::StatusCode::kInvalidArgument));
  return value;
}

// Whether `ptr` is cuMem (VMM) memory, which cudaIpcGetMemHandle refuses: then it can be shared
// only as POSIX fds (FAILED_PRECONDITION when its allocation did not ask for that handle type).
absl::StatusOr<bool> IsVmm(const void* ptr) {
  absl::StatusOr<const cuda::VmmApi*> api = cuda::Vmm();
  if (!api.ok()) return false;  // no driver: the IPC path reports the CUDA error
  absl::StatusOr<uint64_t> legacy = Attribute(
      **api, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr, "IS_LEGACY_CUDA_IPC_CAPABLE");
  if (!legacy.ok() || *legacy != 0) return false;
  KVRAIL_ASSIGN_OR_RETURN(
      uint64_t types,
      Attribute(**api, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, ptr, "ALLOWED_HANDLE_TYPES"));
  if ((types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return absl::FailedPreconditionError(
        "device_ptr: cuMem memory whose allocation did not request "
        "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR cannot be shared with another process (and "
        "cudaIpcGetMemHandle refuses cuMem memory)");
  }
  return true;
}

// The cuMem chunks mapped over [ptr, ptr + bytes), exported as POSIX fds, in address order;
// `offset` is ptr's distance from the first chunk's start.
struct VmmChunks {
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
};

absl::StatusOr<VmmChunks> ExportVmm(const void* ptr, uint64_t bytes) {
  KVRAIL_ASSIGN_OR_RETURN(const cuda::VmmApi* api, cuda::Vmm());
  KVRAIL_ASSIGN_OR_RETURN(uint64_t base, Attribute(*api, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                                   ptr, "MAPPING_BASE_ADDR"));
  VmmChunks out;
  out.offset = reinterpret_cast<uint64_t>(ptr) - base;
  const uint64_t end = reinterpret_cast<uint64_t>(ptr) + bytes;
  for (uint64_t at = base; at < end;) {
    const void* p = reinterpret_cast<const void*>(at);
    KVRAIL_ASSIGN_OR_RETURN(uint64_t start, Attribute(*api, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                                      p, "MAPPING_BASE_ADDR"));
    KVRAIL_ASSIGN_OR_RETURN(uint64_t size,
                            Attribute(*api, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p, "MAPPING_SIZE"));
    if (start != at || size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bytes: the cuMem mappings under [device_ptr, device_ptr + ", bytes,
                       ") are not contiguous at offset ", at - base));
    }
    if (out.fds.size() >= 4096) {
      return absl::InvalidArgumentError("bytes: the range spans more than 4096 cuMem mappings");
    }
    CUmemGenericAllocationHandle handle = 0;
    KVRAIL_RETURN_IF_ERROR(cuda::DriverStatus(api->retain_handle(&handle, const_cast<void*>(p)),
                                              "cuMemRetainAllocationHandle"));
    int fd = -1;
    const CUresult exported =
        api->export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    api->release(handle);  // the retain's reference; the fd keeps the allocation alive
    KVRAIL_RETURN_IF_ERROR(cuda::DriverStatus(exported, "cuMemExportToShareableHandle(POSIX fd)"));
    out.fds.emplace_back(fd);
    out.sizes.push_back(size);
    at += size;
  }
  return out;
}

// The spec of [device_ptr, device_ptr + bytes): CUDA IPC for cudaMalloc memory, cuMem chunks
// passed as fds over `client`'s session socket for VMM memory (nullptr: VMM is refused).
absl::StatusOr<v1::RegionSpec> ShareCuda(Client* client, const void* device_ptr, uint64_t bytes,
                                         v1::RegionSpec spec);

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
  return ShareCuda(nullptr, device_ptr, bytes, std::move(spec));
}

namespace {

absl::StatusOr<v1::RegionSpec> ShareCuda(Client* client, const void* device_ptr, uint64_t bytes,
                                         v1::RegionSpec spec) {
  cudaPointerAttributes attributes{};
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaPointerGetAttributes(&attributes, device_ptr),
                                    "cudaPointerGetAttributes",
                                    absl::StatusCode::kInvalidArgument));
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError("device_ptr: not device memory from cudaMalloc");
  }
  KVRAIL_ASSIGN_OR_RETURN(ScopedDevice on_device, ScopedDevice::Enter(attributes.device));
  KVRAIL_ASSIGN_OR_RETURN(const bool vmm, IsVmm(device_ptr));
  if (vmm) {
    if (client == nullptr) {
      return absl::FailedPreconditionError(
          "device_ptr: cuMem memory is shared as fds over the session socket "
          "(RegisterCudaRegion / kvrail_register_cuda), not in a spec alone");
    }
    if (bytes == 0) return absl::InvalidArgumentError("bytes: must be > 0");
    KVRAIL_ASSIGN_OR_RETURN(VmmChunks chunks, ExportVmm(device_ptr, bytes));
    spec.set_memory_kind(v1::MEMORY_KIND_CUDA);
    spec.set_device(attributes.device);
    spec.set_size_bytes(bytes);
    v1::RegionShare* share = spec.mutable_share();
    share->Clear();
    for (size_t i = 0; i < chunks.fds.size(); ++i) {
      KVRAIL_ASSIGN_OR_RETURN(std::string token, client->ShareFd(chunks.fds[i].get()));
      v1::CudaVmmChunk* chunk = share->mutable_cuda_vmm()->add_chunks();
      chunk->set_fd_token(token);
      chunk->set_size_bytes(chunks.sizes[i]);
    }
    share->set_offset(chunks.offset);
    if (spec.layout_case() == v1::RegionSpec::LAYOUT_NOT_SET) spec.mutable_bytes();
    return spec;
  }
  KVRAIL_ASSIGN_OR_RETURN(auto allocation, AllocationOf(device_ptr));
  const uint64_t offset = static_cast<const uint8_t*>(device_ptr) - allocation.first;
  if (bytes == 0 || bytes > allocation.second - offset) {
    return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes, " at offset ", offset,
                                                   " do not fit the allocation of ",
                                                   allocation.second, " bytes"));
  }
  cudaIpcMemHandle_t handle;
  KVRAIL_RETURN_IF_ERROR(
      CudaStatus(cudaIpcGetMemHandle(&handle, allocation.first), "cudaIpcGetMemHandle"));
  spec.set_memory_kind(v1::MEMORY_KIND_CUDA);
  spec.set_device(attributes.device);
  spec.set_size_bytes(bytes);
  spec.mutable_share()->set_cuda_ipc_handle(
      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
  spec.mutable_share()->set_offset(offset);
  if (spec.layout_case() == v1::RegionSpec::LAYOUT_NOT_SET) spec.mutable_bytes();
  return spec;
}

// Per-layer specs over IPC or cuMem layers (`client` as for ShareCuda).
absl::StatusOr<v1::RegionSpec> LayersSpec(Client* client,
                                          const std::vector<const void*>& layer_ptrs,
                                          uint64_t layer_bytes, v1::RegionSpec spec) {
  if (layer_ptrs.empty()) return absl::InvalidArgumentError("layer_ptrs: empty");
  spec.clear_share();
  spec.clear_layer_shares();
  v1::RegionSpec out;
  for (size_t i = 0; i < layer_ptrs.size(); ++i) {
    absl::StatusOr<v1::RegionSpec> layer = ShareCuda(client, layer_ptrs[i], layer_bytes, spec);
    if (!layer.ok()) {
      return absl::Status(layer.status().code(),
                          absl::StrCat("layer_ptrs[", i, "]: ", layer.status().message()));
    }
    if (i == 0) {
      out = *layer;
      out.clear_share();
    } else if (layer->device() != out.device()) {
      return absl::InvalidArgumentError(absl::StrCat("layer_ptrs[", i, "]: on GPU", layer->device(),
                                                     ", layer 0 on GPU", out.device(),
                                                     " (one region, one GPU)"));
    }
    *out.add_layer_shares() = layer->share();
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::RegionInfo> RegisterCudaRegion(Client& client, const void* device_ptr,
                                                  uint64_t bytes, v1::RegionSpec spec) {
  KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec full,
                          ShareCuda(&client, device_ptr, bytes, std::move(spec)));
  uint64_t session = 0;
  if (!client.unix_socket_path().empty()) {
    KVRAIL_ASSIGN_OR_RETURN(session, client.SessionId());
  }
  return client.RegisterRegion(std::move(full), session);
}

absl::StatusOr<v1::RegionSpec> MakeCudaLayersSpec(const std::vector<const void*>& layer_ptrs,
                                                  uint64_t layer_bytes, v1::RegionSpec spec) {
  return LayersSpec(nullptr, layer_ptrs, layer_bytes, std::move(spec));
}

absl::StatusOr<v1::RegionInfo> RegisterCudaLayers(Client& client,
                                                  const std::vector<const void*>& layer_ptrs,
                                                  uint64_t layer_bytes, v1::RegionSpec spec) {
  KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec full,
                          LayersSpec(&client, layer_ptrs, layer_bytes, std::move(spec)));
  uint64_t session = 0;
  if (!client.unix_socket_path().empty()) {
    KVRAIL_ASSIGN_OR_RETURN(session, client.SessionId());
  }
  return client.RegisterRegion(std::move(full), session);
}

absl::StatusOr<std::unique_ptr<CudaBuffer>> CudaBuffer::Create(int device, size_t bytes) {
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device),
                                    absl::StrCat("cudaSetDevice(", device, ")"),
                                    absl::StatusCode::kFailedPrecondition));
  void* p = nullptr;
  KVRAIL_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&p, bytes), "cudaMalloc", absl::StatusCode::kResourceExhausted));
  return std::unique_ptr<CudaBuffer>(new CudaBuffer(device, static_cast<uint8_t*>(p), bytes));
}

CudaBuffer::~CudaBuffer() {
  cudaSetDevice(device_);
  cudaFree(data_);
}

absl::Status CudaBuffer::CopyFromHost(size_t offset, const void* src, size_t bytes) {
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  return CudaStatus(cudaMemcpy(data_ + offset, src, bytes, cudaMemcpyHostToDevice),
                    "cudaMemcpy H2D");
}

absl::Status CudaBuffer::CopyToHost(size_t offset, void* dst, size_t bytes) const {
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  return CudaStatus(cudaMemcpy(dst, data_ + offset, bytes, cudaMemcpyDeviceToHost),
                    "cudaMemcpy D2H");
}

absl::Status CudaBuffer::Fill(uint8_t value) {
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  KVRAIL_RETURN_IF_ERROR(CudaStatus(cudaMemset(data_, value, size_), "cudaMemset"));
  return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace kvrail::client
