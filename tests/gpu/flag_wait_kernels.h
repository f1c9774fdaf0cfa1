// Kernels for tests/gpu/flag_wait_bench.cc (the GPU stream wait): how fast a copy starts after a
// producer's ready flag, with the CPU poller + launch, a stream-side wait (cuStreamWaitValue32) and
// a persistent few-CTA kernel taking work from a GPU-visible queue. Times are the GPU's
// %globaltimer (ns).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvrail::gpu_bench {

// One CTA spins `ns`, then writes the global timer to *t_end: the producer's last kernel.
cudaError_t LaunchProducer(uint64_t ns, unsigned long long* t_end, cudaStream_t stream);

// `ctas` x 512 threads copy `bytes` (a multiple of 16) from src to dst; the last CTA to finish
// writes the global timer to *t_done (`counter` must be 0 and is left 0).
cudaError_t LaunchCopy(const void* src, void* dst, uint64_t bytes, int ctas, unsigned* counter,
                       unsigned long long* t_done, cudaStream_t stream);

// One work item of the persistent kernel: copy `bytes` once flag word `*flag` has reached `value`
// (wrapping order); `t_done` gets the global timer when every CTA has finished it.
struct QueueItem {
  const void* src;
  void* dst;
  uint64_t bytes;
  unsigned value;
  unsigned long long* t_done;
};

// `ctas` x 512 threads work through items[0, count) in order, each after its flag (a mapped host
// word written by the producer's stream); `*abort` != 0 (mapped host word) ends the kernel at
// once (the daemon's escape from a flag that never comes). `counter` (zeroed, count words).
cudaError_t LaunchPersistent(const QueueItem* items, int count, const volatile unsigned* flag,
                             const volatile unsigned* abort, unsigned* counters, int ctas,
                             cudaStream_t stream);

// A compute-bound load (FMA loops) on `ctas` x 256 threads: stands in for a co-running GEMM.
cudaError_t LaunchFma(int ctas, int iters, float* out, cudaStream_t stream);

}  // namespace kvrail::gpu_bench
