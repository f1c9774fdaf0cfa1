#include "daemon/fabric/tile_copy.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "daemon/fabric/tile_pack.h"
#include "kernels/fabric_pack.h"
#include "kernels/kv_copy.h"

namespace kvrail::fabric {

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

namespace {

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
  KVRAIL_RETURN_IF_ERROR(
      cuda::BatchCopy(dsts.data(), srcs.data(), sizes.data(), sizes.size(), 0, stream, what));
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

// ---- the fabric kernels ----

uint8_t* MappedDeviceAddress(const void* host) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (attr.type != cudaMemoryTypeHost || attr.devicePointer == nullptr) return nullptr;
  return static_cast<uint8_t*>(attr.devicePointer);
}

namespace {

// The ring's device mapping: registered with CUDA (mapped) on the packing kernel's first use.
uint8_t* RingDeviceMemory(CommandRing* ring) {
  return ring->DeviceMemory([](uint8_t* host, size_t bytes) {
    std::pair<uint8_t*, std::shared_ptr<void>> none{nullptr, nullptr};
    std::optional<cuda::HostRegistration> r = PinForGpus(host, bytes);
    if (!r.has_value()) return none;
    auto reg = std::make_shared<cuda::HostRegistration>(*std::move(r));
    uint8_t* device = reg->DevicePointer(host);
    return std::pair<uint8_t*, std::shared_ptr<void>>(device, std::move(reg));
  });
}

}  // namespace

// Set once under `mu` by EnsureUploaded; read without it after EnsureUploaded returned OK (the
// mutex orders the writes before). `stream` before the buffers: they free on it first. Every
// kernel of the transfer runs on `stream`, in launch order (so a tile packed again after a lane
// failover never overlaps its first pack, which shares its arrival word).
struct GpuTileKernels::State {
  absl::Mutex mu;
  bool tried ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  std::optional<cuda::Stream> stream;
  std::optional<kernels::DevicePlanBuffer> buffer;
  std::optional<kernels::FabricArrivals> arrivals;
  std::atomic<uint64_t> kernel_tiles{0};
  std::atomic<uint64_t> fallback_tiles{0};
  // The slots' device addresses (cudaPointerGetAttributes once per slot, not per tile).
  absl::Mutex mapped_mu;
  absl::flat_hash_map<const void*, uint8_t*> mapped ABSL_GUARDED_BY(mapped_mu);
  // Scatter events (ticket - 1 indexes `events`); `free_events` may be recorded again.
  absl::Mutex events_mu;
  std::vector<cudaEvent_t> events ABSL_GUARDED_BY(events_mu);
  std::vector<uint32_t> free_events ABSL_GUARDED_BY(events_mu);
};

// The fabric kernels' warm-up (module load), once per GPU per process, not per transfer.
absl::Status WarmUpFabricKernelsOnce(int device, cudaStream_t stream) {
  static absl::Mutex mu(absl::kConstInit);
  static std::vector<int>* warm = new std::vector<int>();
  absl::MutexLock lock(&mu);
  if (std::find(warm->begin(), warm->end(), device) != warm->end()) return absl::OkStatus();
  KVRAIL_RETURN_IF_ERROR(kernels::WarmUpFabricKernels(stream));
  warm->push_back(device);
  return absl::OkStatus();
}

GpuTileKernels::GpuTileKernels(const planner::Plan& plan, const RegionSide& side, bool pack)
    : plan_(plan), side_(side), pack_(pack), state_(std::make_unique<State>()) {}

GpuTileKernels::~GpuTileKernels() {
  if (!state_->stream.has_value()) return;
  cuda::ScopedDevice on(side_.device);
  state_->arrivals.reset();
  state_->buffer.reset();
  (void)cudaStreamSynchronize(state_->stream->get());
  {
    absl::MutexLock lock(&state_->events_mu);
    for (cudaEvent_t e : state_->events) (void)cudaEventDestroy(e);
    state_->events.clear();
  }
  state_->stream.reset();
}

std::unique_ptr<GpuTileKernels> GpuTileKernels::ForSource(const planner::Plan& plan,
                                                          const RegionSide& src, bool digest,
                                                          bool kernels, std::string* why) {
  if (!src.cuda) {
    *why = "fabric pack: host region, packed by the CPU";
    return nullptr;
  }
  if (digest) {
    *why = "fabric pack: copy engines (spec.digest hashes the packed slot on the host)";
    return nullptr;
  }
  if (!kernels) {
    *why = "fabric pack: copy engines (fabric.gpu_pack copy)";
    return nullptr;
  }
  *why = absl::StrCat("fabric pack: GPU", src.device,
                      " kernel gathers into the mapped send slot and writes the command ring "
                      "(a kernel per free slot in flight)");
  return std::unique_ptr<GpuTileKernels>(new GpuTileKernels(plan, src, /*pack=*/true));
}

std::unique_ptr<GpuTileKernels> GpuTileKernels::ForDestination(const planner::Plan& plan,
                                                               const RegionSide& dst, bool kernels,
                                                               std::string* why) {
  if (!dst.cuda) {
    *why = "fabric unpack: host region, by the CPU";
    return nullptr;
  }
  if (!kernels) {
    *why = "fabric unpack: copy engines (fabric.gpu_pack copy)";
    return nullptr;
  }
  *why = absl::StrCat("fabric unpack: GPU", dst.device,
                      " kernel scatters from the mapped receive slot (several in flight, each "
                      "slot credited when its kernel ends)");
  return std::unique_ptr<GpuTileKernels>(new GpuTileKernels(plan, dst, /*pack=*/false));
}

absl::Status GpuTileKernels::EnsureUploaded() {
  State& st = *state_;
  absl::MutexLock lock(&st.mu);
  if (st.tried) return st.status;
  st.tried = true;
  st.status = [&]() -> absl::Status {
    cuda::ScopedDevice on(side_.device);
    KVRAIL_RETURN_IF_ERROR(on.status());
    KVRAIL_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create(side_.device));
    st.stream.emplace(std::move(stream));
    cudaStream_t s = st.stream->get();
    KVRAIL_RETURN_IF_ERROR(WarmUpFabricKernelsOnce(side_.device, s));
    const uint64_t base = reinterpret_cast<uint64_t>(side_.base);
    KVRAIL_ASSIGN_OR_RETURN(kernels::DevicePlanBuffer buffer,
                            kernels::DevicePlanBuffer::Upload(
                                plan_.header(), plan_.src_blocks().data(),
                                plan_.dst_blocks().data(), pack_ ? base : 0, pack_ ? 0 : base, s));
    st.buffer.emplace(std::move(buffer));
    if (pack_) {
      KVRAIL_ASSIGN_OR_RETURN(kernels::FabricArrivals arrivals,
                              kernels::FabricArrivals::Create(plan_.num_tiles(), s));
      st.arrivals.emplace(std::move(arrivals));
    }
    return cuda::CudaStatus(cudaStreamSynchronize(s), "fabric kernels: plan upload");
  }();
  return st.status;
}

uint8_t* GpuTileKernels::DeviceAddressOf(const void* host) {
  State& st = *state_;
  absl::MutexLock lock(&st.mapped_mu);
  auto it = st.mapped.find(host);
  if (it == st.mapped.end()) it = st.mapped.emplace(host, MappedDeviceAddress(host)).first;
  return it->second;
}

absl::Status GpuTileKernels::PackAndPublish(uint32_t tile, uint32_t slot, uint8_t* staging,
                                            CommandRing* ring, const kernels::NicCommand& engine) {
  // Block ids a deferred-check plan has not checked yet are checked before any address uses them
  // (OK at once for plans checked whole, which the fabric's are today).
  KVRAIL_RETURN_IF_ERROR(plan_.CheckTiles(tile, tile + 1));
  uint8_t* const device_staging = DeviceAddressOf(staging);
  uint8_t* const device_ring = RingDeviceMemory(ring);
  const absl::Status uploaded = EnsureUploaded();
  if (device_staging == nullptr || device_ring == nullptr || !uploaded.ok()) {
    // The GPU cannot reach the slot or the ring (or the plan did not upload): the copy engines
    // pack, this thread pushes the command.
    KVRAIL_RETURN_IF_ERROR(PackTile(plan_, tile, side_, staging));
    kernels::NicCommand cmd = kernels::FabricTileCommand(plan_.header(), tile, slot, engine);
    while (!ring->TryPush(cmd)) std::this_thread::yield();
    state_->fallback_tiles.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  KVRAIL_RETURN_IF_ERROR(cuda::SetDevice(side_.device));
  cudaStream_t stream = state_->stream->get();
  // An earlier kernel of this transfer that failed on the device (a fault: the context is
  // unusable after it) fails this tile rather than queueing behind it.
  if (const cudaError_t e = cudaStreamQuery(stream); e != cudaSuccess && e != cudaErrorNotReady) {
    return cuda::CudaStatus(e, absl::StrCat("fabric pack kernel on GPU", side_.device));
  }
  std::optional<uint64_t> seq;
  while (!(seq = ring->Reserve()).has_value()) std::this_thread::yield();
  kernels::FabricPackTile t;
  t.tile = tile;
  t.slot = slot;
  t.bytes = TileBytes(plan_, tile);
  t.staging = device_staging;
  t.ring_slot = reinterpret_cast<kernels::NicCommand*>(
      device_ring + (reinterpret_cast<uint8_t*>(ring->SlotAt(*seq)) - ring->memory()));
  t.epoch = CommandRing::EpochOf(*seq, ring->capacity());
  t.engine = engine;
  const absl::Status launched =
      kernels::LaunchFabricPack(state_->buffer->plan(), t, state_->arrivals->at(tile), stream);
  if (!launched.ok()) {
    ring->PublishNone(*seq);  // the consumer must not stop at a number nobody will publish
    return launched;
  }
  state_->kernel_tiles.fetch_add(1, std::memory_order_relaxed);
  // Published by the kernel when it ends; not waited for here.
  return absl::OkStatus();
}

absl::Status GpuTileKernels::Flush() {
  {
    absl::MutexLock lock(&state_->mu);
    if (!state_->tried || !state_->status.ok()) return absl::OkStatus();
  }
  KVRAIL_RETURN_IF_ERROR(cuda::SetDevice(side_.device));
  return cuda::CudaStatus(cudaStreamSynchronize(state_->stream->get()),
                          absl::StrCat("fabric kernels on GPU", side_.device));
}

absl::StatusOr<uint64_t> GpuTileKernels::UnpackAsync(uint32_t tile, const uint8_t* staging) {
  KVRAIL_RETURN_IF_ERROR(plan_.CheckTiles(tile, tile + 1));
  const uint8_t* const device_staging = DeviceAddressOf(staging);
  const absl::Status uploaded = EnsureUploaded();
  if (device_staging == nullptr || !uploaded.ok()) {
    state_->fallback_tiles.fetch_add(1, std::memory_order_relaxed);
    KVRAIL_RETURN_IF_ERROR(UnpackTile(plan_, tile, staging, side_));
    return uint64_t{0};
  }
  KVRAIL_RETURN_IF_ERROR(cuda::SetDevice(side_.device));
  cudaStream_t stream = state_->stream->get();
  State& st = *state_;
  uint32_t index;
  cudaEvent_t event;
  {
    absl::MutexLock lock(&st.events_mu);
    if (st.free_events.empty()) {
      cudaEvent_t e = nullptr;
      KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                              "fabric unpack: event"));
      st.events.push_back(e);
      st.free_events.push_back(static_cast<uint32_t>(st.events.size() - 1));
    }
    index = st.free_events.back();
    st.free_events.pop_back();
    event = st.events[index];
  }
  auto give_back = [&st, index] {
    absl::MutexLock lock(&st.events_mu);
    st.free_events.push_back(index);
  };
  if (absl::Status s = kernels::LaunchFabricUnpack(st.buffer->plan(), tile, TileBytes(plan_, tile),
                                                   device_staging, stream);
      !s.ok()) {
    give_back();
    return s;
  }
  st.kernel_tiles.fetch_add(1, std::memory_order_relaxed);
  if (absl::Status s = cuda::CudaStatus(cudaEventRecord(event, stream), "fabric unpack: event");
      !s.ok()) {
    give_back();
    // Launched but not tracked: wait for it here.
    KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamSynchronize(stream), "fabric unpack kernel"));
    return s;
  }
  return uint64_t{index} + 1;
}

std::optional<absl::Status> GpuTileKernels::Poll(uint64_t ticket) {
  if (ticket == 0) return absl::OkStatus();
  State& st = *state_;
  cudaEvent_t event;
  {
    absl::MutexLock lock(&st.events_mu);
    if (ticket > st.events.size()) {
      return absl::InvalidArgumentError("fabric unpack: unknown ticket");
    }
    event = st.events[ticket - 1];
  }
  const cudaError_t e = cudaEventQuery(event);
  if (e == cudaErrorNotReady) return std::nullopt;
  {
    absl::MutexLock lock(&st.events_mu);
    st.free_events.push_back(static_cast<uint32_t>(ticket - 1));
  }
  return cuda::CudaStatus(e, absl::StrCat("fabric unpack kernel on GPU", side_.device));
}

absl::Status GpuTileKernels::Unpack(uint32_t tile, const uint8_t* staging) {
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t ticket, UnpackAsync(tile, staging));
  while (true) {
    std::optional<absl::Status> done = Poll(ticket);
    if (done.has_value()) return *done;
    std::this_thread::yield();
  }
}

uint64_t GpuTileKernels::kernel_tiles() const {
  return state_->kernel_tiles.load(std::memory_order_relaxed);
}
uint64_t GpuTileKernels::fallback_tiles() const {
  return state_->fallback_tiles.load(std::memory_order_relaxed);
}

std::optional<cuda::HostRegistration> PinForGpus(uint8_t* base, uint64_t bytes) {
  const absl::StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok() || *count == 0) return std::nullopt;
  absl::StatusOr<cuda::HostRegistration> r = cuda::HostRegistration::Register(base, bytes, false);
  if (!r.ok()) return std::nullopt;
  return *std::move(r);
}

}  // namespace kvrail::fabric
