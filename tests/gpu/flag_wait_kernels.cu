#include "tests/gpu/flag_wait_kernels.h"

namespace kvrail::gpu_bench {
namespace {

__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void Producer(uint64_t ns, unsigned long long* t_end) {
  const unsigned long long start = GlobalTimer();
  while (GlobalTimer() - start < ns) {
  }
  if (threadIdx.x == 0) {
    *t_end = GlobalTimer();
    __threadfence_system();
  }
}

__device__ void CopyPart(const uint4* src, uint4* dst, uint64_t n) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

// Every CTA has finished its part: the last one (by the counter) stamps the time.
__device__ void FinishItem(unsigned* counter, unsigned long long* t_done) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(counter, 1u) == gridDim.x - 1) {
      *t_done = GlobalTimer();
      __threadfence_system();
      *counter = 0;
    }
  }
}

__global__ void Copy(const uint4* src, uint4* dst, uint64_t n, unsigned* counter,
                     unsigned long long* t_done) {
  CopyPart(src, dst, n);
  FinishItem(counter, t_done);
}

__global__ void Persistent(const QueueItem* items, int count, const volatile unsigned* flag,
                           const volatile unsigned* abort, unsigned* counters) {
  __shared__ int go;
  for (int i = 0; i < count; ++i) {
    const QueueItem item = items[i];
    if (threadIdx.x == 0) {
      int state = 0;
      while (state == 0) {
        if (static_cast<int>(*flag - item.value) >= 0)
          state = 1;
        else if (*abort != 0)
          state = -1;
        else
          __nanosleep(200);
      }
      go = state;
    }
    __syncthreads();
    if (go < 0) return;
    __threadfence();  // the producer's bytes before the flag
    CopyPart(static_cast<const uint4*>(item.src), static_cast<uint4*>(item.dst), item.bytes / 16);
    // Each item has its own counter so a fast CTA moving on cannot race the last one's reset.
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(&counters[i], 1u) == gridDim.x - 1) {
        *item.t_done = GlobalTimer();
        __threadfence_system();
      }
    }
  }
}

__global__ void Fma(int iters, float* out) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f, d = blockIdx.x * 1e-4f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, b, c);
    d = fmaf(d, c, b);
    b = fmaf(b, a, -d) * 1e-7f + 1.0001f;
  }
  if (a + d == 12345.0f) out[blockIdx.x] = a + b + d;
}

}  // namespace

cudaError_t LaunchProducer(uint64_t ns, unsigned long long* t_end, cudaStream_t stream) {
  Producer<<<1, 32, 0, stream>>>(ns, t_end);
  return cudaGetLastError();
}

cudaError_t LaunchCopy(const void* src, void* dst, uint64_t bytes, int ctas, unsigned* counter,
                       unsigned long long* t_done, cudaStream_t stream) {
  Copy<<<ctas, 512, 0, stream>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst),
                                 bytes / 16, counter, t_done);
  return cudaGetLastError();
}

cudaError_t LaunchPersistent(const QueueItem* items, int count, const volatile unsigned* flag,
                             const volatile unsigned* abort, unsigned* counters, int ctas,
                             cudaStream_t stream) {
  Persistent<<<ctas, 512, 0, stream>>>(items, count, flag, abort, counters);
  return cudaGetLastError();
}

cudaError_t LaunchFma(int ctas, int iters, float* out, cudaStream_t stream) {
  Fma<<<ctas, 256, 0, stream>>>(iters, out);
  return cudaGetLastError();
}

}  // namespace kvrail::gpu_bench
