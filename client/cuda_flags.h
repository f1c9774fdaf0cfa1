// Layer readiness flags driven from CUDA streams, for layer-wise transfers (see
// daemon/readiness/readiness.h for the protocol): a producer marks "layer L written" from its own
// stream, after the kernel that wrote the layer, without the CPU. The flag words live in host
// memory shared with kvraild (a HostBuffer registered as a bytes region) and pinned + mapped for
// the GPU here. A consumer waits for the daemon's arrival flags from its own stream with
// WaitOnStream (cuStreamWaitValue32). UNVERIFIED ON A GPU as of 2026-11-29: the one earlier attempt
// hung while the consumer's work was being enqueued, most likely because a synchronous CUDA call
// (device-wide) came after the waits and before the producer started, which can never finish;
// tests/gpu/flags_gpu_test.cc now enqueues on non-blocking streams only and releases a stuck wait
// from the host after a timeout. Use it only on non-blocking streams, and enqueue the producer
// before anything synchronous.
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
  static absl::StatusOr<std::unique_ptr<CudaFlags>> Map(uint32_t* words, uint32_t count, int device);
  // Enqueues "words[index] = value" on `stream`: it happens after all earlier work of the stream
  // (cuStreamWriteValue32; the write is visible to the host once performed).
  virtual absl::Status SignalOnStream(CUstream_st* stream, uint32_t index, uint32_t value) = 0;
  // Enqueues "wait until words[index] >= value" (epoch order, as the daemon writes them) on
  // `stream`: later work of the stream starts only then (cuStreamWaitValue32, GEQ).
  virtual absl::Status WaitOnStream(CUstream_st* stream, uint32_t index, uint32_t value) = 0;
};

}  // namespace kvrail::client
