// Host-side helpers over the CUDA runtime for the daemon: CUDA errors as absl::Status (converted
// here, with the runtime's error name and text), RAII owners of streams, events and host
// registrations, device selection, allocation ranges and peer access.
//
// Thread contract: free functions may be called from any thread; each one that touches a device
// selects it for the call only (ScopedDevice: the calling thread's current device is restored
// afterwards), so callers neither rely on nor lose the thread's current device. RAII objects are
// not thread-safe; their CUDA handles may be used from any thread after creation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::cuda {

// OK for cudaSuccess; else INTERNAL "<what>: <cudaErrorName>: <text>". Clears the runtime's
// non-sticky last error.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);
// Same with a chosen code (e.g. INVALID_ARGUMENT for a bad handle).
absl::Status CudaStatus(cudaError_t error, absl::string_view what, absl::StatusCode code);

// Enqueues copies dsts[i] <- srcs[i] (sizes[i] bytes), i < n, on `stream` with the copy engines
// (cudaMemcpyBatchAsync in calls of at most 65536, sources read in stream order); `flags` are
// cudaMemcpyFlags (e.g. cudaMemcpyFlagPreferOverlapWithCompute). Returns once enqueued.
absl::Status BatchCopy(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n,
                       unsigned flags, cudaStream_t stream, absl::string_view what);

// Whether `error` leaves the process's context for that device unusable until the process
// exits (a kernel fault such as cudaErrorIllegalAddress): every later call on it fails too.
bool IsStickyError(cudaError_t error);

// Devices the runtime sees; FAILED_PRECONDITION with the runtime's reason when there is no
// driver or no device.
absl::StatusOr<int> DeviceCount();
// cudaSetDevice with the error converted. Binds the calling thread to `device` for good: for a
// thread that serves one GPU (a dispatcher). Code that needs a device for a while uses
// ScopedDevice instead.
absl::Status SetDevice(int device);

// Makes `device` the calling thread's current device for the guard's lifetime, then makes the
// device that was current before current again. Code that touches another GPU on a thread bound
// to one (a dispatcher that drops the last reference to another GPU's mapping) must not leave the
// thread on the other GPU: its later events and launches would go there. `get` / `set` are
// cudaGetDevice / cudaSetDevice (injectable for tests). When the previous device cannot be read,
// nothing is changed and status() says why. Not thread-safe: construct and destroy on one thread.
class ScopedDevice {
 public:
  using GetFn = cudaError_t (*)(int* device);
  using SetFn = cudaError_t (*)(int device);
  explicit ScopedDevice(int device, GetFn get = &cudaGetDevice, SetFn set = &cudaSetDevice);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  // OK when `device` is current; else the runtime's error ("cudaSetDevice(3): ...").
  const absl::Status& status() const { return status_; }

 private:
  const SetFn set_;
  int previous_ = -1;  // restored on destruction when >= 0
  absl::Status status_;
};
// The allocation holding `ptr` (cuMemGetAddressRange through the runtime's driver entry point,
// so nothing links libcuda).
struct AllocationRange {
  uint64_t base = 0;
  uint64_t bytes = 0;
};
absl::StatusOr<AllocationRange> GetAllocationRange(const void* ptr);

// A driver API function (e.g. "cuStreamWaitValue32") through the runtime's entry point query, so
// nothing links libcuda directly; nullptr when the driver offers none (the runtime's error is
// cleared). Cast the result to the function's type.
void* DriverEntryPoint(const char* name);

// The device that holds `ptr` (device memory), or -1 for host memory.
absl::StatusOr<int> PointerDevice(const void* ptr);
// Lets kernels on `device` access `peer`'s memory; idempotent. FAILED_PRECONDITION when the pair
// has no peer access.
absl::Status EnablePeerAccess(int device, int peer);
bool CanAccessPeer(int device, int peer);

// A non-blocking stream on one device.
class Stream {
 public:
  // A non-blocking stream of the device's greatest priority (the engine's copies go first).
  static absl::StatusOr<Stream> Create(int device);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

 private:
  Stream(cudaStream_t s, int device) : stream_(s), device_(device) {}
  void Destroy();  // under a ContextSyncScope (see Create)
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

// An event (with timing) on the device current at creation.
class Event {
 public:
  static absl::StatusOr<Event> Create();
  Event() = default;  // empty: get() is nullptr
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();
  cudaEvent_t get() const { return event_; }

 private:
  explicit Event(cudaEvent_t e) : event_(e) {}
  cudaEvent_t event_ = nullptr;
};

// Host memory pinned and mapped into every device's address space (cudaHostRegister, portable +
// mapped; read-only for read-only mappings). Unregistered on destruction.
class HostRegistration {
 public:
  static absl::StatusOr<HostRegistration> Register(void* base, uint64_t bytes, bool read_only);
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();
  // Device address of host address `host` (inside the registration).
  uint8_t* DevicePointer(const uint8_t* host) const {
    return device_base_ + (host - static_cast<const uint8_t*>(base_));
  }

 private:
  HostRegistration(void* base, uint8_t* device_base) : base_(base), device_base_(device_base) {}
  void* base_ = nullptr;
  uint8_t* device_base_ = nullptr;
};

}  // namespace kvrail::cuda
