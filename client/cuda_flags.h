// Layer readiness flags driven from CUDA streams, for layer-wise transfers (see
// daemon/readiness/readiness.h for the protocol): a producer marks "layer L written" from its own
// stream, after the kernel that wrote the layer, without the CPU. The flag words live in host
// memory shared with kvraild (a HostBuffer registered as a bytes region) and pinned + mapped for
// the GPU here. Consumers read the daemon's arrival flags from the CPU for now: a stream-side wait
// (cuStreamWaitValue32) hung while the consumer's work was being enqueued in the one GPU attempt
// (2026-11-29, cause not found) and is not offered until a GPU test passes.
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
  static absl::StatusOr<std::unique_ptr<CudaFlags>> Map(uint32_t* words, uint32_t count, int device);
  // Enqueues "words[index] = value" on `stream`: it happens after all earlier work of the stream
  // (cuStreamWriteValue32; the write is visible to the host once performed).
  virtual absl::Status SignalOnStream(CUstream_st* stream, uint32_t index, uint32_t value) = 0;
};

}  // namespace kvrail::client
