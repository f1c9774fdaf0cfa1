// Test-only CUDA helpers behind a plain C++ header (the test itself is compiled by the host
// compiler, which does not see the CUDA headers). Every helper aborts with the CUDA error on
// failure: these run only in GPU tests.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace kvrail::gpu_test {

int DeviceCount();
std::string DeviceName(int device);
int SmCount(int device);

void* DeviceAlloc(size_t bytes);
// `bytes` on GPU `device`; the calling thread's current device is kept.
void* DeviceAllocOn(int device, size_t bytes);

// The GPU pair a test moves between, from KVRAIL_GPU_PAIR ("SRC,DST", as tests/gpu/run.sh
// exports it); {0, 0} when unset. Aborts on a malformed value.
std::pair<int, int> GpuPairFromEnv();
// Makes `src` current and, when the two differ, enables peer access both ways (aborts when the
// pair has none).
void UseGpuPair(int src, int dst);
void DeviceFree(void* ptr);
// Pinned host memory mapped into the device's address space; `device_ptr` receives its device
// address.
void* HostAllocMapped(size_t bytes, void** device_ptr);
void HostFree(void* ptr);

void CopyToDevice(void* dst, const void* src, size_t bytes);
void CopyToHost(void* dst, const void* src, size_t bytes);
void Memset(void* dst, int value, size_t bytes);
// Waits for the device; aborts if a kernel failed.
void Sync();

// Milliseconds between two points on the default stream.
class Timer {
 public:
  Timer();
  ~Timer();
  void Start();
  float StopMs();  // waits for the stop event

 private:
  void* start_;
  void* stop_;
};

// Time of `iters` device-to-device cudaMemcpyAsync calls of `bytes` (after one warm-up), ms each.
float TimeMemcpyD2D(void* dst, const void* src, size_t bytes, int iters);

}  // namespace kvrail::gpu_test
