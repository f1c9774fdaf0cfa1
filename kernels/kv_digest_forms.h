// Every digest mode, the benchmark modes included (kv_digest.h: DigestKernelMode's ...ForBenchmark
// values), for benchmarks and tests that compare them. The daemon links only //kernels:kv_digest,
// which builds the modes it launches; this library builds the others too.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/kv_digest.h"

namespace kvrail::kernels {

// LaunchKvDigest for any mode.
absl::Status LaunchKvDigestForm(const DevicePlan& plan, uint32_t tile_begin, uint32_t tile_end,
                                DigestKernelMode mode, uint64_t* tile_digests, int num_ctas,
                                CudaStream stream, int threads_per_cta = 512);

}  // namespace kvrail::kernels
