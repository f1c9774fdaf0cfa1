#include "daemon/fabric/tile_copy.h"

#include <cuda_runtime_api.h>

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/common/status.h"
#include "daemon/cuda/cuda_util.h"
#include "daemon/fabric/tile_pack.h"

namespace kvrail::fabric {
namespace {

// One copy of a tile's run list, region side and packed side.
struct Copies {
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<size_t> bytes;
};

// This thread's stream on `device` (created on first use, kept for the thread's life).
absl::StatusOr<cudaStream_t> ThreadStream(int device) {
  thread_local std::map<int, cuda::Stream> streams;
  auto it = streams.find(device);
  if (it == streams.end()) {
    ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create(device));
    it = streams.emplace(device, std::move(stream)).first;
  }
  return it->second.get();
}

// Runs the batch on the device's stream with the copy engines and waits for it.
absl::Status RunCopies(int device, const Copies& c) {
  RETURN_IF_ERROR(cuda::SetDevice(device));
  ASSIGN_OR_RETURN(cudaStream_t stream, ThreadStream(device));
  cudaMemcpyAttributes attrs{};
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attrs_index = 0;
  constexpr size_t kMaxPerCall = 1 << 16;
  for (size_t first = 0; first < c.bytes.size(); first += kMaxPerCall) {
    const size_t n = std::min(kMaxPerCall, c.bytes.size() - first);
    RETURN_IF_ERROR(cuda::CudaStatus(
        cudaMemcpyBatchAsync(const_cast<void**>(c.dst.data() + first),
                             const_cast<void**>(c.src.data() + first),
                             const_cast<size_t*>(c.bytes.data() + first), n, &attrs,
                             &attrs_index, 1, stream),
        "fabric tile copy: cudaMemcpyBatchAsync"));
  }
  return cuda::CudaStatus(cudaStreamSynchronize(stream), "fabric tile copy");
}

class StagingPinImpl final : public StagingPin {
 public:
  explicit StagingPinImpl(cuda::HostRegistration r) : registration_(std::move(r)) {}

 private:
  cuda::HostRegistration registration_;
};

}  // namespace

absl::Status PackTile(const planner::Plan& plan, uint32_t tile, const RegionSide& src,
                      uint8_t* staging) {
  if (!src.cuda) {
    PackTileHost(plan, tile, src.base, staging);
    return absl::OkStatus();
  }
  Copies c;
  uint64_t packed = 0;
  planner::ForEachTileRun(plan, tile, [&](const planner::CopyRun& run) {
    c.dst.push_back(staging + packed);
    c.src.push_back(src.base + run.src);
    c.bytes.push_back(run.bytes);
    packed += run.bytes;
  });
  absl::Status s = RunCopies(src.device, c);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("packing from GPU", src.device, ": ", s.message()));
  return s;
}

absl::Status UnpackTile(const planner::Plan& plan, uint32_t tile, const uint8_t* staging,
                        const RegionSide& dst) {
  if (!dst.cuda) {
    UnpackTileHost(plan, tile, staging, dst.base);
    return absl::OkStatus();
  }
  Copies c;
  uint64_t packed = 0;
  planner::ForEachTileRun(plan, tile, [&](const planner::CopyRun& run) {
    c.dst.push_back(dst.base + run.dst);
    c.src.push_back(staging + packed);
    c.bytes.push_back(run.bytes);
    packed += run.bytes;
  });
  absl::Status s = RunCopies(dst.device, c);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("unpacking into GPU", dst.device, ": ", s.message()));
  return s;
}

std::unique_ptr<StagingPin> StagingPin::Pin(uint8_t* base, uint64_t bytes) {
  const absl::StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok() || *count == 0) return nullptr;
  absl::StatusOr<cuda::HostRegistration> r = cuda::HostRegistration::Register(base, bytes, false);
  if (!r.ok()) return nullptr;
  return std::make_unique<StagingPinImpl>(*std::move(r));
}

}  // namespace kvrail::fabric
