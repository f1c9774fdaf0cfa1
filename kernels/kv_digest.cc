// Host side of kv_digest.h: argument checks, CUDA errors as absl::Status.
#include "kernels/kv_digest.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/kv_digest_launch.h"

namespace kvrail::kernels {
namespace {

absl::Status CudaStatus(int error, const char* what) {
  if (error == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", internal::DigestErrorName(error), ": ",
                                          internal::DigestErrorString(error)));
}

}  // namespace

absl::Status LaunchKvDigest(const DevicePlan& plan, uint32_t tile_begin, uint32_t tile_end,
                            DigestKernelMode mode, uint64_t* tile_digests, int num_ctas,
                            CudaStream stream, int threads_per_cta) {
  if (tile_end > plan.num_tiles || tile_begin > tile_end) {
    return absl::InvalidArgumentError(absl::StrCat("tiles [", tile_begin, ", ", tile_end,
                                                   ") outside the plan's ", plan.num_tiles));
  }
  if (num_ctas <= 0 || threads_per_cta <= 0 || threads_per_cta > 512 || threads_per_cta % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad launch shape: ", num_ctas, " CTAs x ", threads_per_cta, " threads"));
  }
  if (tile_digests == nullptr) return absl::InvalidArgumentError("tile_digests: null");
  if (mode != DigestKernelMode::kCopyHashSource && mode != DigestKernelMode::kHashSource &&
      mode != DigestKernelMode::kHashDestination) {
    return absl::InvalidArgumentError(absl::StrCat("mode ", static_cast<int>(mode),
                                                   " is a benchmark mode: launch it with "
                                                   "kernels/kv_digest_forms.h"));
  }
  // The staging for the device Upload probed (DevicePlan::arch), not asked again per launch.
  return CudaStatus(internal::KvDigestLaunch(plan.header, tile_begin, tile_end,
                                             static_cast<int>(mode), tile_digests, num_ctas,
                                             threads_per_cta, plan.access_bytes, plan.piece_bytes,
                                             static_cast<int>(DigestStagingOn(plan.arch)), stream),
                    "kv_digest launch");
}

absl::Status ZeroDigests(uint64_t* tile_digests, size_t count, CudaStream stream) {
  return CudaStatus(internal::DigestZero(tile_digests, count, stream), "zero digests");
}

absl::StatusOr<std::vector<uint64_t>> ReadDigests(const uint64_t* tile_digests, uint32_t begin,
                                                  uint32_t end, CudaStream stream) {
  std::vector<uint64_t> out(end > begin ? end - begin : 0);
  if (out.empty()) return out;
  const absl::Status s = CudaStatus(
      internal::DigestToHost(out.data(), tile_digests + begin, out.size(), stream), "read digests");
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<TileDigestBuffer> TileDigestBuffer::Create(uint32_t num_tiles, CudaStream stream) {
  TileDigestBuffer b;
  b.num_tiles_ = num_tiles;
  b.stream_ = stream;
  const size_t bytes = 2 * sizeof(uint64_t) * (num_tiles == 0 ? 1 : num_tiles);
  void* device = nullptr;
  absl::Status s =
      CudaStatus(internal::DigestDeviceAlloc(&device, bytes, stream), "cudaMallocAsync(digests)");
  if (!s.ok()) return s;
  b.device_ = static_cast<uint64_t*>(device);
  void* host = nullptr;
  s = CudaStatus(internal::DigestHostAlloc(&host, bytes), "cudaMallocHost(digests)");
  if (!s.ok()) return s;  // b's destructor frees the device memory
  b.host_ = static_cast<uint64_t*>(host);
  s = ZeroDigests(b.device_, 2 * size_t{num_tiles}, stream);
  if (!s.ok()) return s;
  return b;
}

TileDigestBuffer::TileDigestBuffer(TileDigestBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      host_(std::exchange(other.host_, nullptr)),
      num_tiles_(other.num_tiles_),
      stream_(other.stream_) {}

TileDigestBuffer& TileDigestBuffer::operator=(TileDigestBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = std::exchange(other.device_, nullptr);
    host_ = std::exchange(other.host_, nullptr);
    num_tiles_ = other.num_tiles_;
    stream_ = other.stream_;
  }
  return *this;
}

TileDigestBuffer::~TileDigestBuffer() { Release(); }

void TileDigestBuffer::Release() {
  if (device_ != nullptr) internal::DigestDeviceFree(device_, stream_);
  // The host mirror may still be the target of an enqueued copy: cudaFreeHost waits for the
  // device (owners drop the buffer only after their last batch completed, so it does not wait).
  if (host_ != nullptr) internal::DigestHostFree(host_);
  device_ = nullptr;
  host_ = nullptr;
}

absl::Status TileDigestBuffer::CopyBack(uint32_t begin, uint32_t end) {
  if (end > num_tiles_ || begin > end) {
    return absl::InvalidArgumentError(
        absl::StrCat("digest tiles [", begin, ", ", end, ") outside ", num_tiles_));
  }
  if (begin == end) return absl::OkStatus();
  KVRAIL_RETURN_IF_ERROR(CudaStatus(
      internal::DigestCopyToHostAsync(host_ + begin, device_ + begin, end - begin, stream_),
      "copy source digests"));
  return CudaStatus(
      internal::DigestCopyToHostAsync(host_ + num_tiles_ + begin, device_ + num_tiles_ + begin,
                                      end - begin, stream_),
      "copy destination digests");
}

}  // namespace kvrail::kernels
