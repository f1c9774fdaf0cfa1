// Layer readiness flags driven from CUDA streams, for layer-wise transfers (see
// daemon/readiness/readiness.h for the protocol): a producer marks "layer L written" from its own
// stream, after the kernel that wrote the layer, without the CPU; a consumer makes its stream wait
// until the daemon says layer L arrived. The flag words live in host memory shared with kvraild
// (a HostBuffer registered as a bytes region) and pinned + mapped for the GPU here.
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
  // Enqueues "wait until words[index] has reached value (wrapping order)" on `stream`
  // (cuStreamWaitValue32 GEQ): later work of the stream starts only after the daemon signalled.
  virtual absl::Status WaitOnStream(CUstream_st* stream, uint32_t index, uint32_t value) = 0;
};

}  // namespace kvrail::client
