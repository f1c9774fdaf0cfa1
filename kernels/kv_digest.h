// The integrity digest on the GPU (TransferSpec.digest; the hash and its contract:
// kernels/digest.h). Three kernels over a DevicePlan (kv_copy.h), all adding tile t's digest
// into tile_digests[t] (a device array of plan.num_tiles uint64, zeroed first: ZeroDigests):
//  - kCopyHashSource: the fused gather/scatter of kv_copy.h that also hashes the source bytes as
//    it moves them (the source is read once; warp-path plans stage each piece in shared memory,
//    192 KiB of dynamic shared memory per 512-thread CTA, and hash it there);
//  - kHashDestination: reads the destination back after the bytes landed and hashes it;
//  - kHashSource: hashes the source without copying (for copies done by the copy engines).
// The host twin computes the same values (planner::TileDigestHost); tests/gpu:digest_gpu_test
// compares them. Stream-ordered like LaunchKvCopy. Thread-compatible.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/kv_copy.h"

namespace kvrail::kernels {

enum class DigestKernelMode : int {
  kCopyHashSource = 1,
  kHashSource = 2,
  kHashDestination = 3,
  // Benchmarks only: the fused kernel's copy with the hash left out (same work distribution as
  // kCopyHashSource, tile_digests untouched), the fair digest-off baseline of its cost. Warp and
  // slab paths only (plans with accesses under 8 bytes: InvalidArgument).
  kCopyNoHashForBenchmark = 4,
  // Benchmarks only: kCopyHashSource on the warp path's previous kernel (the pieces held in
  // registers, two in flight per warp), which the shared-memory staged kernel replaced; warp-path
  // plans only (others: InvalidArgument).
  kCopyHashSourceRegistersForBenchmark = 5,
  // Benchmarks only, warp-path plans only: the staged warp kernel (which takes each piece into
  // shared memory with one bulk copy, cp.async.bulk, and writes it back with one bulk store) with
  // per-lane 16-byte cp.async into shared memory and stores from registers (6), or with the bulk
  // load but stores from registers (7; 8 without the hash).
  kCopyHashSourceCpAsyncForBenchmark = 6,
  kCopyHashSourceBulkLoadForBenchmark = 7,
  kCopyNoHashBulkLoadForBenchmark = 8,
};

// Enqueues the digest kernel `mode` (kCopyHashSource, kHashSource or kHashDestination; the
// benchmark modes launch through kv_digest_forms.h, INVALID_ARGUMENT here) for tiles [tile_begin,
// tile_end) of `plan` on `stream`
// (`tile_digests`: device memory, at least plan.num_tiles entries). Launch shape as LaunchKvCopy.
absl::Status LaunchKvDigest(const DevicePlan& plan, uint32_t tile_begin, uint32_t tile_end,
                            DigestKernelMode mode, uint64_t* tile_digests, int num_ctas,
                            CudaStream stream, int threads_per_cta = 512);

// Per-tile digests of one transfer for an engine: device memory for the source and the
// destination digests of `num_tiles` tiles (zeroed), and a pinned host mirror the engine copies
// finished tiles into on the stream (CopyBack), so reading them needs no extra synchronization
// once an event recorded after CopyBack has passed. Stream-ordered like DevicePlanBuffer:
// allocated, zeroed and freed in `stream`'s order. Move-only; thread-compatible.
class TileDigestBuffer {
 public:
  static absl::StatusOr<TileDigestBuffer> Create(uint32_t num_tiles, CudaStream stream);
  TileDigestBuffer(TileDigestBuffer&& other) noexcept;
  TileDigestBuffer& operator=(TileDigestBuffer&& other) noexcept;
  TileDigestBuffer(const TileDigestBuffer&) = delete;
  TileDigestBuffer& operator=(const TileDigestBuffer&) = delete;
  ~TileDigestBuffer();

  uint64_t* source() const { return device_; }
  uint64_t* destination() const { return device_ + num_tiles_; }
  // Enqueues the copy of tiles [begin, end) of both arrays into the host mirror.
  absl::Status CopyBack(uint32_t begin, uint32_t end);
  // The mirror (valid for tiles whose CopyBack the stream has passed).
  uint64_t host_source(uint32_t tile) const { return host_[tile]; }
  uint64_t host_destination(uint32_t tile) const { return host_[num_tiles_ + tile]; }

 private:
  TileDigestBuffer() = default;
  void Release();
  uint64_t* device_ = nullptr;
  uint64_t* host_ = nullptr;
  uint32_t num_tiles_ = 0;
  CudaStream stream_ = nullptr;
};

// Zeroes `count` digests in device memory (stream-ordered).
absl::Status ZeroDigests(uint64_t* tile_digests, size_t count, CudaStream stream);
// Copies digests [begin, end) to the host after the stream's work so far (waits for `stream`).
absl::StatusOr<std::vector<uint64_t>> ReadDigests(const uint64_t* tile_digests, uint32_t begin,
                                                  uint32_t end, CudaStream stream);

}  // namespace kvrail::kernels
