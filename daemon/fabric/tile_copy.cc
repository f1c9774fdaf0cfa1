#include "daemon/fabric/tile_copy.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "daemon/fabric/tile_pack.h"

namespace kvrail::fabric {
namespace {

// This thread's stream on `device` (created on first use, kept for the thread's life).
absl::StatusOr<cudaStream_t> ThreadStream(int device) {
  thread_local std::map<int, cuda::Stream> streams;
  auto it = streams.find(device);
  if (it == streams.end()) {
    KVRAIL_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create(device));
    it = streams.emplace(device, std::move(stream)).first;
  }
  return it->second.get();
}

// Copies the tile's runs between GPU memory at `gpu` (on `device`) and the packed staging slot,
// into the slot when `pack`, out of it otherwise, and waits for them. `dst_side`: the runs'
// destination offsets (with `pack`: reading the destination back, spec.digest).
absl::Status CopyTileRuns(const planner::Plan& plan, uint32_t tile, int device, uint8_t* gpu,
                          uint8_t* staging, bool pack, bool dst_side = false) {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  uint64_t packed = 0;
  planner::ForEachTileRun(plan, tile, [&](const planner::CopyRun& run) {
    uint8_t* region = gpu + (pack && !dst_side ? run.src : run.dst);
    dsts.push_back(pack ? staging + packed : region);
    srcs.push_back(pack ? region : staging + packed);
    sizes.push_back(run.bytes);
    packed += run.bytes;
  });
  const std::string what = absl::StrCat(pack ? "packing from GPU" : "unpacking into GPU", device);
  KVRAIL_RETURN_IF_ERROR(cuda::SetDevice(device));
  KVRAIL_ASSIGN_OR_RETURN(cudaStream_t stream, ThreadStream(device));
  KVRAIL_RETURN_IF_ERROR(cuda::BatchCopy(dsts.data(), srcs.data(), sizes.data(), sizes.size(), 0, stream,
                                  what));
  return cuda::CudaStatus(cudaStreamSynchronize(stream), what);
}

}  // namespace

absl::Status PackTile(const planner::Plan& plan, uint32_t tile, const RegionSide& src,
                      uint8_t* staging) {
  if (src.cuda) return CopyTileRuns(plan, tile, src.device, src.base, staging, /*pack=*/true);
  PackTileHost(plan, tile, src.base, staging);
  return absl::OkStatus();
}

absl::Status UnpackTile(const planner::Plan& plan, uint32_t tile, const uint8_t* staging,
                        const RegionSide& dst) {
  if (dst.cuda) {
    return CopyTileRuns(plan, tile, dst.device, dst.base, const_cast<uint8_t*>(staging),
                        /*pack=*/false);
  }
  UnpackTileHost(plan, tile, staging, dst.base);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PackTileWithDigest(const planner::Plan& plan, uint32_t tile,
                                            const RegionSide& src, uint8_t* staging) {
  uint64_t digest;
  if (src.cuda) {
    KVRAIL_RETURN_IF_ERROR(CopyTileRuns(plan, tile, src.device, src.base, staging, /*pack=*/true));
    digest = planner::PackedTileDigest(plan, tile, staging);
  } else {
    digest = PackTileHostWithDigest(plan, tile, src.base, staging);
  }
  std::memcpy(staging + TileBytes(plan, tile), &digest, sizeof(digest));
  return digest;
}

uint64_t TrailerDigest(const planner::Plan& plan, uint32_t tile, const uint8_t* staging) {
  uint64_t digest;
  std::memcpy(&digest, staging + TileBytes(plan, tile), sizeof(digest));
  return digest;
}

absl::StatusOr<uint64_t> DestinationTileDigest(const planner::Plan& plan, uint32_t tile,
                                               const RegionSide& dst, uint8_t* scratch) {
  if (!dst.cuda) {
    return planner::TileDigestHost(plan, tile, dst.base, planner::DigestSide::kDestination);
  }
  KVRAIL_RETURN_IF_ERROR(CopyTileRuns(plan, tile, dst.device, dst.base, scratch,
                                      /*pack=*/true, /*dst_side=*/true));
  return planner::PackedTileDigest(plan, tile, scratch);
}

std::optional<cuda::HostRegistration> PinForGpus(uint8_t* base, uint64_t bytes) {
  const absl::StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok() || *count == 0) return std::nullopt;
  absl::StatusOr<cuda::HostRegistration> r = cuda::HostRegistration::Register(base, bytes, false);
  if (!r.ok()) return std::nullopt;
  return *std::move(r);
}

}  // namespace kvrail::fabric
