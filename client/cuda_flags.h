// Layer readiness flags driven from CUDA streams, for layer-wise transfers (see
// daemon/readiness/readiness.h for the protocol): a producer marks "layer L written" from its own
// stream, after the kernel that wrote the layer, without the CPU. The flag words live in host
// memory shared with kvraild (a HostBuffer registered as a bytes region) and pinned + mapped for
// the GPU here. A consumer waits for the daemon's arrival flags from its own stream with
// WaitOnStream (cuStreamWaitValue32).
//
// A pending wait blocks more than its stream: anything that synchronizes the context waits for
// it too. Besides the explicit ones (cudaDeviceSynchronize, cudaMalloc/cudaFree, synchronous
// copies), a kernel's FIRST launch under lazy module loading (CUDA 12's default,
// CUDA_MODULE_LOADING=LAZY) loads its module and may synchronize the context. If the work that
// leads to the awaited flag runs in the SAME process (a producer stream beside the consumer, as
// in tests/gpu/flags_gpu_test.cc on one GPU), such a call after the waits deadlocks: the
// one-GPU hang seen in tests/gpu was exactly this (the producer's kernel launched for the first
// time after the consumer's waits). So: use non-blocking streams, load every kernel the process
// will launch while waits are pending beforehand (launch it once, or run with
// CUDA_MODULE_LOADING=EAGER), and make no synchronous CUDA call between enqueuing waits and
// the producer's work. A consumer whose producer is another process (kvraild plus a prefill
// process) only stalls on such calls until the flags arrive.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

struct CUstream_st;

namespace kvrail::client {

// Owns the GPU mapping of a flag array (cudaHostRegister'ed host memory). Thread-safe after
// creation; the host memory must outlive it.
class CudaFlags {
 public:
  virtual ~CudaFlags() = default;
  // Pins and maps `words` (count 32-bit words, 4-byte aligned host memory) for GPU `device`.
  // The calling thread's current device is unchanged afterwards (here and in the destructor).
  static absl::StatusOr<std::unique_ptr<CudaFlags>> Map(uint32_t* words, uint32_t count,
                                                        int device);
  // Enqueues "words[index] = value" on `stream`: it happens after all earlier work of the stream
  // (cuStreamWriteValue32; the write is visible to the host once performed).
  virtual absl::Status SignalOnStream(CUstream_st* stream, uint32_t index, uint32_t value) = 0;
  // Enqueues "wait until words[index] >= value" (epoch order, as the daemon writes them) on
  // `stream`: later work of the stream starts only then (cuStreamWaitValue32, GEQ).
  virtual absl::Status WaitOnStream(CUstream_st* stream, uint32_t index, uint32_t value) = 0;
};

}  // namespace kvrail::client
