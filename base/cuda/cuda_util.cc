#include "base/cuda/cuda_util.h"

#include <cuda.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/cuda/context_sync.h"

namespace kvrail::cuda {

absl::Status CudaStatus(cudaError_t error, absl::string_view what, absl::StatusCode code) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  return absl::Status(
      code, absl::StrCat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

absl::Status BatchCopy(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n,
                       unsigned flags, cudaStream_t stream, absl::string_view what) {
  cudaMemcpyAttributes attrs{};
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attrs.flags = flags;
  size_t attrs_index = 0;
  constexpr size_t kMaxPerCall = 1 << 16;
  for (size_t first = 0; first < n; first += kMaxPerCall) {
    const size_t count = std::min(kMaxPerCall, n - first);
    const cudaError_t e = cudaMemcpyBatchAsync(
        const_cast<void**>(dsts + first), const_cast<void**>(srcs + first),
        const_cast<size_t*>(sizes + first), count, &attrs, &attrs_index, 1, stream);
    if (e != cudaSuccess) return CudaStatus(e, absl::StrCat(what, ": cudaMemcpyBatchAsync"));
  }
  return absl::OkStatus();
}

bool IsStickyError(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  return CudaStatus(error, what, absl::StatusCode::kInternal);
}

absl::StatusOr<int> DeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    return CudaStatus(e, "cudaGetDeviceCount", absl::StatusCode::kFailedPrecondition);
  }
  if (n == 0) return absl::FailedPreconditionError("cudaGetDeviceCount: no CUDA device");
  return n;
}

absl::Status SetDevice(int device) {
  return CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
}

ScopedDevice::ScopedDevice(int device, GetFn get, SetFn set) : set_(set) {
  int previous = -1;
  status_ = CudaStatus(get(&previous), "cudaGetDevice");
  if (!status_.ok()) return;  // nothing changed: nothing to restore
  if (previous == device) return;
  status_ = CudaStatus(set(device), absl::StrCat("cudaSetDevice(", device, ")"));
  if (status_.ok()) previous_ = previous;  // a failed set left `previous` current
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0 && set_(previous_) != cudaSuccess) cudaGetLastError();
}

namespace {

using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

GetAddressRangeFn AddressRangeFn() {
  static const auto fn =
      reinterpret_cast<GetAddressRangeFn>(DriverEntryPoint("cuMemGetAddressRange"));
  return fn;
}

}  // namespace

void* DriverEntryPoint(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // not sticky: clear it for the caller's next runtime call
    return nullptr;
  }
  return p;
}

absl::StatusOr<AllocationRange> GetAllocationRange(const void* ptr) {
  GetAddressRangeFn fn = AddressRangeFn();
  if (fn == nullptr) {
    return absl::FailedPreconditionError("the driver has no cuMemGetAddressRange entry point");
  }
  CUdeviceptr base = 0;
  size_t bytes = 0;
  const CUresult r = fn(&base, &bytes, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuMemGetAddressRange: driver error ", static_cast<int>(r)));
  }
  return AllocationRange{static_cast<uint64_t>(base), static_cast<uint64_t>(bytes)};
}

absl::StatusOr<int> PointerDevice(const void* ptr) {
  cudaPointerAttributes attributes{};
  const cudaError_t e = cudaPointerGetAttributes(&attributes, ptr);
  if (e != cudaSuccess) return CudaStatus(e, "cudaPointerGetAttributes");
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    return -1;
  return attributes.device;
}

bool CanAccessPeer(int device, int peer) {
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return can != 0;
}

namespace {

// The (device, peer) pairs whose peer access this process has enabled. Thread-safe: every field
// is guarded by mu; one table per process (peer access is a property of the process's contexts).
struct PeerAccessTable {
  absl::Mutex mu;
  std::set<std::pair<int, int>> enabled ABSL_GUARDED_BY(mu);
};

PeerAccessTable& ThePeerAccessTable() {
  static PeerAccessTable* const table = new PeerAccessTable();  // never destroyed: no exit order
  return *table;
}

}  // namespace

absl::Status EnablePeerAccess(int device, int peer) {
  PeerAccessTable& table = ThePeerAccessTable();
  // Held across the CUDA calls too: two threads enabling the same pair must not race to
  // cudaDeviceEnablePeerAccess (and each other's SetDevice).
  absl::MutexLock lock(&table.mu);
  if (device == peer || table.enabled.count({device, peer}) != 0) return absl::OkStatus();
  if (!CanAccessPeer(device, peer)) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU", device, " cannot access GPU", peer, "'s memory (no peer access)"));
  }
  ScopedDevice on(device);
  if (!on.status().ok()) return on.status();
  cudaError_t e;
  {
    ContextSyncScope sync("cudaDeviceEnablePeerAccess");
    e = cudaDeviceEnablePeerAccess(peer, 0);
  }
  if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
    return CudaStatus(e,
                      absl::StrCat("cudaDeviceEnablePeerAccess(GPU", device, " -> GPU", peer, ")"));
  }
  cudaGetLastError();
  table.enabled.insert({device, peer});
  return absl::OkStatus();
}

absl::StatusOr<Stream> Stream::Create(int device) {
  ScopedDevice on(device);
  if (!on.status().ok()) return on.status();
  // The greatest priority the device offers: the block scheduler starts the engine's CTAs ahead
  // of waiting CTAs of lower-priority streams (the inference server's kernels, under MPS too),
  // so a small SM budget is not starved behind a GEMM that fills the GPU.
  int least = 0, greatest = 0;
  if (absl::Status s = CudaStatus(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                                  "cudaDeviceGetStreamPriorityRange");
      !s.ok()) {
    return s;
  }
  cudaStream_t stream = nullptr;
  cudaError_t made;
  {
    // Stream creation and destruction were seen not to return while another stream of the
    // process waited on the GPU (cuStreamWaitValue32; docs/benchmarks.md): marked, so the CUDA
    // engine's gate watchdog bounds them like the other such calls.
    ContextSyncScope sync("cudaStreamCreateWithPriority");
    made = cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest);
  }
  if (absl::Status s = CudaStatus(made, "cudaStreamCreateWithPriority"); !s.ok()) return s;
  return Stream(stream, device);
}

void Stream::Destroy() {
  if (stream_ == nullptr) return;
  ContextSyncScope sync("cudaStreamDestroy");
  cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Destroy();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

Stream::~Stream() { Destroy(); }

absl::StatusOr<Event> Event::Create() {
  cudaEvent_t event = nullptr;
  if (absl::Status s = CudaStatus(cudaEventCreate(&event), "cudaEventCreate"); !s.ok()) return s;
  return Event(event);
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

absl::StatusOr<HostRegistration> HostRegistration::Register(void* base, uint64_t bytes,
                                                            bool read_only) {
  unsigned flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
  if (read_only) flags |= cudaHostRegisterReadOnly;
  cudaError_t registered;
  {
    ContextSyncScope sync("cudaHostRegister");
    registered = cudaHostRegister(base, bytes, flags);
  }
  if (absl::Status s = CudaStatus(registered, "cudaHostRegister"); !s.ok()) {
    return s;
  }
  void* device = nullptr;
  if (absl::Status s =
          CudaStatus(cudaHostGetDevicePointer(&device, base, 0), "cudaHostGetDevicePointer");
      !s.ok()) {
    ContextSyncScope sync("cudaHostUnregister");
    cudaHostUnregister(base);
    return s;
  }
  return HostRegistration(base, static_cast<uint8_t*>(device));
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), device_base_(other.device_base_) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) {
      ContextSyncScope sync("cudaHostUnregister");
      cudaHostUnregister(base_);
    }
    base_ = std::exchange(other.base_, nullptr);
    device_base_ = other.device_base_;
  }
  return *this;
}

HostRegistration::~HostRegistration() {
  if (base_ == nullptr) return;
  ContextSyncScope sync("cudaHostUnregister");
  cudaHostUnregister(base_);
}

}  // namespace kvrail::cuda
