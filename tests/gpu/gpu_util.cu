#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "tests/gpu/gpu_util.h"

namespace kvrail::gpu_test {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s: %s\n", what, cudaGetErrorName(e),
                 cudaGetErrorString(e));
    std::abort();
  }
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::string DeviceName(int device) {
  cudaDeviceProp p{};
  Check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  return p.name;
}

int SmCount(int device) {
  int n = 0;
  Check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "SM count");
  return n;
}

void* DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  Check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

void DeviceFree(void* ptr) { Check(cudaFree(ptr), "cudaFree"); }

void* DeviceAllocOn(int device, size_t bytes) {
  int current = 0;
  Check(cudaGetDevice(&current), "cudaGetDevice");
  Check(cudaSetDevice(device), "cudaSetDevice");
  void* p = DeviceAlloc(bytes);
  Check(cudaSetDevice(current), "cudaSetDevice");
  return p;
}

std::pair<int, int> GpuPairFromEnv() {
  const char* env = std::getenv("KVRAIL_GPU_PAIR");
  std::pair<int, int> pair{0, 0};
  if (env == nullptr || *env == '\0') return pair;
  if (std::sscanf(env, "%d,%d", &pair.first, &pair.second) != 2 || pair.first < 0 ||
      pair.second < 0) {
    std::fprintf(stderr, "KVRAIL_GPU_PAIR: expected \"SRC,DST\", got \"%s\"\n", env);
    std::abort();
  }
  return pair;
}

void UseGpuPair(int src, int dst) {
  if (src != dst) {
    for (const auto& [from, to] : {std::pair<int, int>{src, dst}, std::pair<int, int>{dst, src}}) {
      int can = 0;
      Check(cudaDeviceCanAccessPeer(&can, from, to), "cudaDeviceCanAccessPeer");
      if (can == 0) {
        std::fprintf(stderr, "GPU%d cannot reach GPU%d (no peer access)\n", from, to);
        std::abort();
      }
      Check(cudaSetDevice(from), "cudaSetDevice");
      const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
      if (e != cudaErrorPeerAccessAlreadyEnabled) Check(e, "cudaDeviceEnablePeerAccess");
      cudaGetLastError();
    }
  }
  Check(cudaSetDevice(src), "cudaSetDevice");
}

void* HostAllocMapped(size_t bytes, void** device_ptr) {
  void* p = nullptr;
  Check(cudaHostAlloc(&p, bytes, cudaHostAllocMapped), "cudaHostAlloc");
  Check(cudaHostGetDevicePointer(device_ptr, p, 0), "cudaHostGetDevicePointer");
  return p;
}

void HostFree(void* ptr) { Check(cudaFreeHost(ptr), "cudaFreeHost"); }

void CopyToDevice(void* dst, const void* src, size_t bytes) {
  Check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

void CopyToHost(void* dst, const void* src, size_t bytes) {
  Check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

void Memset(void* dst, int value, size_t bytes) {
  Check(cudaMemset(dst, value, bytes), "cudaMemset");
}

void Sync() { Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

Timer::Timer() {
  cudaEvent_t a, b;
  Check(cudaEventCreate(&a), "cudaEventCreate");
  Check(cudaEventCreate(&b), "cudaEventCreate");
  start_ = a;
  stop_ = b;
}

Timer::~Timer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void Timer::Start() { Check(cudaEventRecord(static_cast<cudaEvent_t>(start_), 0), "record"); }

float Timer::StopMs() {
  Check(cudaEventRecord(static_cast<cudaEvent_t>(stop_), 0), "record");
  Check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "sync");
  float ms = 0;
  Check(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)),
      "elapsed");
  return ms;
}

float TimeMemcpyD2D(void* dst, const void* src, size_t bytes, int iters) {
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0), "warm-up memcpy");
  Timer t;
  t.Start();
  for (int i = 0; i < iters; ++i) {
    Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0), "memcpy");
  }
  return t.StopMs() / iters;
}

}  // namespace kvrail::gpu_test
