#include "daemon/fabric/relay.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/cuda/cuda_util.h"
#include "base/status.h"
#include "daemon/fabric/tile_copy.h"
#include "daemon/fabric/tile_pack.h"
#include "kernels/fabric_pack.h"
#include "kernels/kv_copy.h"

namespace kvrail::fabric {

// ---- the pure part ----

RelayConfig ParseRelayConfig(const char* value) {
  RelayConfig c;
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "auto") return c;
  if (v == "off") {
    c.mode = RelayMode::kOff;
  } else if (v == "host") {
    c.mode = RelayMode::kHost;
  } else if (absl::string_view rest = v; absl::ConsumePrefix(&rest, "gpu:")) {
    int gpu = -1;
    if (absl::SimpleAtoi(rest, &gpu) && gpu >= 0 && gpu < 1024) {
      c.mode = RelayMode::kGpu;
      c.gpu = gpu;
    } else {
      c.mode = RelayMode::kOff;
      c.error = absl::StrCat("fabric.relay: ", v, ": gpu:<ordinal> needs an ordinal");
    }
  } else {
    c.mode = RelayMode::kOff;
    c.error = absl::StrCat("fabric.relay: ", v.substr(0, 64),
                           " not understood (auto, off, host, gpu:<ordinal>)");
  }
  return c;
}

NicLoad NicLoadOfLanes(const scheduler::RailNode& node, const std::vector<std::string>& lane_nics,
                       const std::vector<uint32_t>& lane_tiles, uint64_t tile_bytes) {
  NicLoad out;
  out.bytes.assign(node.nics.size(), 0);
  out.tiles.assign(node.nics.size(), 0);
  for (size_t l = 0; l < lane_nics.size() && l < lane_tiles.size(); ++l) {
    if (lane_nics[l].empty()) continue;
    for (size_t n = 0; n < node.nics.size(); ++n) {
      if (node.nics[n].name != lane_nics[l]) continue;
      out.tiles[n] += lane_tiles[l];
      out.bytes[n] += uint64_t{lane_tiles[l]} * tile_bytes;
      break;
    }
  }
  return out;
}

namespace {

// The live figure behind a relay chosen on load: "tiles out: mlx5_0 12, mlx5_1 0 (each counted
// as a 4.0 MiB slot)" over the region's GPU's NICs and the relay GPU's; "" without one.
std::string TilesOut(const RelayInput& in, const scheduler::SideRelay& side) {
  if (in.nic_tiles.empty()) return "";
  std::vector<int> nics = in.node->gpus[side.gpu].nics;
  nics.insert(nics.end(), side.nics.begin(), side.nics.end());
  std::vector<std::string> parts;
  for (int nic : nics) {
    const uint32_t tiles = static_cast<size_t>(nic) < in.nic_tiles.size() ? in.nic_tiles[nic] : 0;
    parts.push_back(absl::StrCat(in.node->nics[nic].name, " ", tiles));
  }
  return absl::StrFormat("; tiles out: %s (each counted as a %.1f MiB slot)",
                         absl::StrJoin(parts, ", "),
                         static_cast<double>(in.slot_bytes) / (1 << 20));
}

const char* Hop(RelaySide side) { return side == RelaySide::kSend ? "send" : "receive"; }

RelayPlan None(const RelayInput& in, std::string why) {
  RelayPlan p;
  p.side = in.side;
  p.region_device = in.cuda ? in.device : -1;
  p.reason = absl::StrCat("relay: none (", why, ")");
  return p;
}

// A relay chosen (or forced) that cannot be made here: the direct path, `why` saying so.
RelayPlan NotMade(const RelayInput& in, std::string why, bool by_load = false) {
  RelayPlan p = None(in, std::move(why));
  p.wanted = true;
  p.by_load = by_load;
  return p;
}

// The stages of a GPU relay, for the reason.
std::string GpuStages(RelaySide side, int region, int relay) {
  const std::string over = region == relay ? "its own memory" : "NVLink";
  if (side == RelaySide::kSend) {
    return absl::StrCat("pack kernel on GPU", region, " writes GPU", relay, "'s relay slot (", over,
                        "), GPU", relay, "'s stream copies it to the send slot");
  }
  return absl::StrCat("GPU", relay,
                      "'s stream copies the receive slot to its relay slot, unpack "
                      "kernel on GPU",
                      region, " reads it (", over, ")");
}

}  // namespace

RelayPlan PlanRelay(const RelayInput& in) {
  const RelayConfig& c = in.config;
  if (!c.error.empty()) return None(in, c.error);
  if (c.mode == RelayMode::kOff) return None(in, "fabric.relay off");
  if (in.digest) return None(in, "spec.digest: hashed on the host on the direct path");
  if (in.slots == 0 || in.slot_bytes == 0) return None(in, "no relay slots");
  RelayPlan p;
  p.side = in.side;
  p.region_device = in.cuda ? in.device : -1;
  p.slots = in.slots;
  p.slot_bytes = in.slot_bytes;
  if (c.mode == RelayMode::kHost) {
    p.kind = RelayKind::kHost;
    p.reason = in.side == RelaySide::kSend
                   ? "relay: host twin (fabric.relay host, test): packed into a host relay "
                     "slot, then copied to the send slot"
                   : "relay: host twin (fabric.relay host, test): the receive slot copied "
                     "to a host relay slot, then scattered from it";
    return p;
  }
  if (!in.cuda) return None(in, "host region");
  const int s = in.device;
  int r = -1;
  std::string why;
  if (c.mode == RelayMode::kGpu) {
    r = c.gpu;
    why = absl::StrCat("GPU", s, " -> GPU", r, " (forced: fabric.relay gpu:", r, ", test)");
  } else {
    if (in.node == nullptr) return None(in, "no local topology");
    if (in.gpu_index < 0) return None(in, absl::StrCat("GPU", s, " not in the local topology"));
    scheduler::RailOptions options;
    options.bytes = in.bytes;
    const absl::StatusOr<scheduler::SideRelay> side =
        scheduler::ChooseSideRelay(*in.node, in.gpu_index, in.nic_load, options);
    if (!side.ok()) return None(in, std::string(side.status().message()));
    if (side->relay_gpu == side->gpu) return None(in, side->reason);
    p.by_load = side->by_load;
    why = side->by_load ? absl::StrCat(side->reason, TilesOut(in, *side)) : side->reason;
    const size_t ri = static_cast<size_t>(side->relay_gpu);
    r = ri < in.ordinal_of_index.size() ? in.ordinal_of_index[ri] : -1;
    if (r < 0) {
      return NotMade(in,
                     absl::StrCat(why, "; but GPU", side->relay_gpu,
                                  " is not visible to this daemon: direct path"),
                     p.by_load);
    }
    p.relay_gpu_index = side->relay_gpu;
  }
  if (r >= in.devices) {
    return NotMade(
        in,
        absl::StrCat(why, "; but there is no GPU", r, " here (", in.devices, " GPUs): direct path"),
        p.by_load);
  }
  if (r != s && !(in.can_access_peer && in.can_access_peer(s, r))) {
    return NotMade(
        in, absl::StrCat(why, "; but GPU", s, " has no peer access to GPU", r, ": direct path"),
        p.by_load);
  }
  p.kind = RelayKind::kGpu;
  p.relay_device = r;
  p.peer_access = r != s;
  p.kernel_device = s;
  p.copy_device = r;
  p.reason = absl::StrCat("relay (", Hop(in.side), "): ", why, "; ", GpuStages(in.side, s, r));
  return p;
}

uint64_t RelaySlotOffset(const RelayPlan& plan, uint32_t k) {
  return uint64_t{k} * plan.slot_bytes;
}

// ---- the runtime ----

namespace {

std::atomic<uint64_t> g_relayed[2];

// A pool of `slots` relay slots of `slot_bytes` in one block (host memory, or device memory of
// one GPU). Acquire blocks while all are taken (they are as many as the threads that take them,
// each holding one at a time, so it does not wait in practice). Thread contract: thread-safe.
class SlotPool {
 public:
  SlotPool(uint8_t* base, uint32_t slots, uint64_t slot_bytes)
      : base_(base), slot_bytes_(slot_bytes), taken_(slots, false) {}
  uint8_t* base() const { return base_; }
  uint32_t Acquire() {
    absl::MutexLock lock(&mu_);
    while (true) {
      for (uint32_t k = 0; k < taken_.size(); ++k) {
        if (!taken_[k]) {
          taken_[k] = true;
          return k;
        }
      }
      cv_.Wait(&mu_);
    }
  }
  void Release(uint32_t k) {
    {
      absl::MutexLock lock(&mu_);
      taken_[k] = false;
    }
    cv_.Signal();
  }
  uint8_t* At(uint32_t k) const { return base_ + uint64_t{k} * slot_bytes_; }

 private:
  uint8_t* const base_;
  const uint64_t slot_bytes_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<bool> taken_ ABSL_GUARDED_BY(mu_);
};

// Holds slot k of a pool for one tile.
class SlotLease {
 public:
  explicit SlotLease(SlotPool* pool) : pool_(pool), k_(pool->Acquire()) {}
  ~SlotLease() { pool_->Release(k_); }
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  uint8_t* get() const { return pool_->At(k_); }

 private:
  SlotPool* const pool_;
  const uint32_t k_;
};

// Thread contract: see RelayStage. Pools are made on first use under mu_ and kept for the
// stage's life (their addresses stay valid without the lock).
class RelayStageImpl final : public RelayStage {
 public:
  RelayStageImpl(RelaySide side, const FabricOptions& options, const RelayConfig& config,
                 LaneLoadSource lane_load)
      : side_(side), options_(options), config_(config), lane_load_(std::move(lane_load)) {
    if (options_.topology != nullptr) {
      absl::StatusOr<scheduler::RailNode> node = scheduler::BuildRailNode(*options_.topology);
      if (node.ok()) node_.emplace(*std::move(node));
      ordinal_of_index_.assign(options_.topology->gpus_size(), -1);
      for (const auto& gpu : options_.topology->gpus()) {
        if (gpu.index() >= 0 && gpu.index() < options_.topology->gpus_size()) {
          ordinal_of_index_[gpu.index()] = gpu.cuda_ordinal();
        }
      }
    }
    const absl::StatusOr<int> count = cuda::DeviceCount();
    devices_ = count.ok() ? *count : 0;
    slots_ = static_cast<uint32_t>(
        std::max(1, std::max(options_.pack_threads, options_.unpack_threads)));
  }
  ~RelayStageImpl() override {
    absl::MutexLock lock(&mu_);
    for (auto& [device, pool] : gpu_pools_) {
      cuda::ScopedDevice on(device);
      (void)cudaFree(pool->base());
    }
  }

  std::unique_ptr<RelayTransfer> ForTransfer(const planner::Plan& plan, const RegionSide& region,
                                             int gpu_index, bool digest, RelayNote* note) override;
  uint64_t relayed_tiles() const override { return relayed_.load(std::memory_order_relaxed); }

  void CountTile() {
    relayed_.fetch_add(1, std::memory_order_relaxed);
    g_relayed[side_ == RelaySide::kSend ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
  }
  absl::StatusOr<SlotPool*> HostPool();
  absl::StatusOr<SlotPool*> GpuPool(int device);

 private:
  const RelaySide side_;
  const FabricOptions options_;
  const RelayConfig config_;
  const LaneLoadSource lane_load_;  // null: no live load (see Create)
  std::optional<scheduler::RailNode> node_;
  std::vector<int> ordinal_of_index_;
  int devices_ = 0;
  uint32_t slots_ = 1;
  std::atomic<uint64_t> relayed_{0};
  absl::Mutex mu_;
  std::unique_ptr<uint8_t[]> host_memory_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<SlotPool> host_pool_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::unique_ptr<SlotPool>> gpu_pools_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<SlotPool*> RelayStageImpl::HostPool() {
  absl::MutexLock lock(&mu_);
  if (host_pool_ == nullptr) {
    host_memory_.reset(new (std::nothrow) uint8_t[slots_ * options_.slot_bytes]);
    if (host_memory_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("relay: ", slots_, " host relay slots of ", options_.slot_bytes, " bytes"));
    }
    host_pool_ = std::make_unique<SlotPool>(host_memory_.get(), slots_, options_.slot_bytes);
  }
  return host_pool_.get();
}

absl::StatusOr<SlotPool*> RelayStageImpl::GpuPool(int device) {
  absl::MutexLock lock(&mu_);
  auto it = gpu_pools_.find(device);
  if (it != gpu_pools_.end()) return it->second.get();
  cuda::ScopedDevice on(device);
  KVRAIL_RETURN_IF_ERROR(on.status());
  void* memory = nullptr;
  KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(
      cudaMalloc(&memory, slots_ * options_.slot_bytes),
      absl::StrCat("relay: cudaMalloc of ", slots_, " relay slots on GPU", device)));
  auto pool =
      std::make_unique<SlotPool>(static_cast<uint8_t*>(memory), slots_, options_.slot_bytes);
  SlotPool* out = pool.get();
  gpu_pools_.emplace(device, std::move(pool));
  return out;
}

absl::Status CheckTile(const planner::Plan& plan, uint32_t tile, uint64_t slot_bytes,
                       uint64_t* bytes) {
  if (tile >= plan.num_tiles()) {
    return absl::InvalidArgumentError(absl::StrCat("relay: tile ", tile, " of ", plan.num_tiles()));
  }
  KVRAIL_RETURN_IF_ERROR(plan.CheckTiles(tile, tile + 1));
  *bytes = TileBytes(plan, tile);
  if (*bytes > slot_bytes) {
    return absl::InternalError(absl::StrCat("relay: tile ", tile, " has ", *bytes,
                                            " bytes, the relay slots ", slot_bytes));
  }
  return absl::OkStatus();
}

// One stage of a GPU relay hop: on `device`, `enqueue` puts its work on this thread's stream
// there (tile_copy's ThreadStream), then waits for it; `what` names the stage in errors
// (`enqueue` gets it too).
template <typename Enqueue>
absl::Status OnThreadStream(int device, const std::string& what, Enqueue enqueue) {
  cuda::ScopedDevice on(device);
  KVRAIL_RETURN_IF_ERROR(on.status());
  KVRAIL_ASSIGN_OR_RETURN(cudaStream_t stream, ThreadStream(device));
  KVRAIL_RETURN_IF_ERROR(enqueue(stream, what));
  return cuda::CudaStatus(cudaStreamSynchronize(stream), what);
}

// Counts each tile of one transfer once in its stage: a lane failover's re-send packs a tile
// again (fabric_tiles_resent_total counts those), a repeat is not a second tile. Thread
// contract: thread-safe; tiles are checked against the plan before Count.
class TileTally {
 public:
  TileTally(RelayStageImpl* stage, uint32_t tiles)
      : stage_(stage), counted_(new std::atomic<bool>[tiles]()) {}
  void Count(uint32_t tile) {
    if (!counted_[tile].exchange(true, std::memory_order_relaxed)) stage_->CountTile();
  }

 private:
  RelayStageImpl* const stage_;
  const std::unique_ptr<std::atomic<bool>[]> counted_;
};

// The host twin: the same hops through a host relay slot.
class HostRelay final : public RelayTransfer {
 public:
  HostRelay(RelayStageImpl* stage, SlotPool* pool, const planner::Plan& plan,
            const RegionSide& region, RelayPlan relay)
      : tally_(stage, plan.num_tiles()),
        pool_(pool),
        plan_(plan),
        region_(region),
        relay_(std::move(relay)) {}
  absl::Status Pack(uint32_t tile, uint8_t* send_slot) override {
    uint64_t bytes = 0;
    KVRAIL_RETURN_IF_ERROR(CheckTile(plan_, tile, relay_.slot_bytes, &bytes));
    SlotLease slot(pool_);
    KVRAIL_RETURN_IF_ERROR(PackTile(plan_, tile, region_, slot.get()));
    std::memcpy(send_slot, slot.get(), bytes);
    tally_.Count(tile);
    return absl::OkStatus();
  }
  absl::Status Unpack(uint32_t tile, const uint8_t* recv_slot) override {
    uint64_t bytes = 0;
    KVRAIL_RETURN_IF_ERROR(CheckTile(plan_, tile, relay_.slot_bytes, &bytes));
    SlotLease slot(pool_);
    std::memcpy(slot.get(), recv_slot, bytes);
    KVRAIL_RETURN_IF_ERROR(UnpackTile(plan_, tile, slot.get(), region_));
    tally_.Count(tile);
    return absl::OkStatus();
  }
  const RelayPlan& plan() const override { return relay_; }

 private:
  TileTally tally_;
  SlotPool* const pool_;
  const planner::Plan& plan_;
  const RegionSide region_;
  const RelayPlan relay_;
};

// The GPU relay: kernel on the region's GPU, relay slot on R, R's stream for the slot copy.
class GpuRelay final : public RelayTransfer {
 public:
  GpuRelay(RelayStageImpl* stage, SlotPool* pool, const planner::Plan& plan,
           const RegionSide& region, RelayPlan relay)
      : tally_(stage, plan.num_tiles()),
        pool_(pool),
        plan_(plan),
        region_(region),
        relay_(std::move(relay)) {}
  ~GpuRelay() override {
    if (!stream_.has_value()) return;
    cuda::ScopedDevice on(region_.device);
    buffer_.reset();
    (void)cudaStreamSynchronize(stream_->get());
    stream_.reset();
  }

  absl::Status Pack(uint32_t tile, uint8_t* send_slot) override {
    uint64_t bytes = 0;
    KVRAIL_RETURN_IF_ERROR(CheckTile(plan_, tile, relay_.slot_bytes, &bytes));
    KVRAIL_RETURN_IF_ERROR(EnsureUploaded());
    SlotLease slot(pool_);
    // S's kernel stores the packed tile through R's device address (peer access).
    KVRAIL_RETURN_IF_ERROR(OnThreadStream(
        relay_.kernel_device,
        absl::StrCat("relay: pack kernel on GPU", relay_.kernel_device, " into GPU",
                     relay_.relay_device, "'s relay slot"),
        [&](cudaStream_t stream, const std::string&) {
          kernels::FabricPackTile t;
          t.tile = tile;
          t.bytes = bytes;
          t.staging = slot.get();
          t.ring_slot = nullptr;  // the host posts the command once the bytes are in the send slot
          return kernels::LaunchFabricPack(buffer_->plan(), t, nullptr, stream);
        }));
    // R's stream: relay slot -> the lane's pinned host send slot.
    KVRAIL_RETURN_IF_ERROR(OnThreadStream(
        relay_.copy_device,
        absl::StrCat("relay: GPU", relay_.copy_device, " relay slot to the send slot"),
        [&](cudaStream_t stream, const std::string& what) {
          return cuda::CudaStatus(
              cudaMemcpyAsync(send_slot, slot.get(), bytes, cudaMemcpyDeviceToHost, stream), what);
        }));
    tally_.Count(tile);
    return absl::OkStatus();
  }

  absl::Status Unpack(uint32_t tile, const uint8_t* recv_slot) override {
    uint64_t bytes = 0;
    KVRAIL_RETURN_IF_ERROR(CheckTile(plan_, tile, relay_.slot_bytes, &bytes));
    KVRAIL_RETURN_IF_ERROR(EnsureUploaded());
    SlotLease slot(pool_);
    // R's stream: the host receive slot -> R's relay slot.
    KVRAIL_RETURN_IF_ERROR(OnThreadStream(
        relay_.copy_device,
        absl::StrCat("relay: receive slot to GPU", relay_.copy_device, "'s relay slot"),
        [&](cudaStream_t stream, const std::string& what) {
          return cuda::CudaStatus(
              cudaMemcpyAsync(slot.get(), recv_slot, bytes, cudaMemcpyHostToDevice, stream), what);
        }));
    // D's kernel reads R's relay slot (peer access) and scatters into the destination.
    KVRAIL_RETURN_IF_ERROR(OnThreadStream(
        relay_.kernel_device,
        absl::StrCat("relay: unpack kernel on GPU", relay_.kernel_device, " from GPU",
                     relay_.relay_device, "'s relay slot"),
        [&](cudaStream_t stream, const std::string&) {
          return kernels::LaunchFabricUnpack(buffer_->plan(), tile, bytes, slot.get(), stream);
        }));
    tally_.Count(tile);
    return absl::OkStatus();
  }
  const RelayPlan& plan() const override { return relay_; }

 private:
  // The plan on the region's GPU (once, on first use; the kernels' warm-up once per GPU).
  absl::Status EnsureUploaded() {
    absl::MutexLock lock(&mu_);
    if (tried_) return status_;
    tried_ = true;
    status_ = [&]() -> absl::Status {
      cuda::ScopedDevice on(region_.device);
      KVRAIL_RETURN_IF_ERROR(on.status());
      KVRAIL_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create(region_.device));
      stream_.emplace(std::move(stream));
      cudaStream_t s = stream_->get();
      KVRAIL_RETURN_IF_ERROR(WarmUpFabricKernelsOnce(region_.device, s));
      const uint64_t base = reinterpret_cast<uint64_t>(region_.base);
      const bool pack = relay_.side == RelaySide::kSend;
      KVRAIL_ASSIGN_OR_RETURN(kernels::DevicePlanBuffer buffer,
                              kernels::DevicePlanBuffer::Upload(
                                  plan_.header(), plan_.src_blocks().data(),
                                  plan_.dst_blocks().data(), pack ? base : 0, pack ? 0 : base, s));
      buffer_.emplace(std::move(buffer));
      return cuda::CudaStatus(cudaStreamSynchronize(s), "relay: plan upload");
    }();
    return status_;
  }

  TileTally tally_;
  SlotPool* const pool_;
  const planner::Plan& plan_;
  const RegionSide region_;
  const RelayPlan relay_;
  absl::Mutex mu_;
  bool tried_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Set once under mu_ by EnsureUploaded; read without it after it returned OK. `stream_` before
  // the buffer: the buffer frees on it first.
  std::optional<cuda::Stream> stream_;
  std::optional<kernels::DevicePlanBuffer> buffer_;
};

std::unique_ptr<RelayTransfer> RelayStageImpl::ForTransfer(const planner::Plan& plan,
                                                           const RegionSide& region, int gpu_index,
                                                           bool digest, RelayNote* note) {
  RelayInput in;
  in.side = side_;
  in.config = config_;
  in.cuda = region.cuda;
  in.device = region.device;
  in.digest = digest;
  in.bytes = plan.bytes_total();
  in.node = node_.has_value() ? &*node_ : nullptr;
  in.gpu_index = gpu_index;
  in.ordinal_of_index = ordinal_of_index_;
  if (lane_load_ && region.cuda && node_.has_value() && config_.mode == RelayMode::kAuto) {
    // The daemon gathers, the hierarchy decides: the lanes' tiles out now, per NIC (a host
    // region's transfer never relays: PlanRelay does not read it, so it is not gathered).
    NicLoad load = NicLoadOfLanes(*node_, options_.lane_nics, lane_load_(), options_.slot_bytes);
    in.nic_load = std::move(load.bytes);
    in.nic_tiles = std::move(load.tiles);
  }
  in.devices = devices_;
  in.can_access_peer = [](int a, int b) { return cuda::CanAccessPeer(a, b); };
  in.slots = slots_;
  in.slot_bytes = options_.slot_bytes;
  RelayPlan relay = PlanRelay(in);
  note->text = relay.reason;
  note->kind = RelayNote::Kind::kRelayed;
  // Not made: the direct path; said when the relay was forced or off, or wanted here.
  auto not_made = [&](std::string text) {
    note->text = std::move(text);
    note->kind = RelayNote::Kind::kSaid;
    return nullptr;
  };
  switch (relay.kind) {
    case RelayKind::kNone:
      note->kind = config_.mode == RelayMode::kAuto && !relay.wanted ? RelayNote::Kind::kQuiet
                                                                     : RelayNote::Kind::kSaid;
      return nullptr;
    case RelayKind::kHost: {
      absl::StatusOr<SlotPool*> pool = HostPool();
      if (!pool.ok()) {
        return not_made(
            absl::StrCat(relay.reason, "; not made (", pool.status().message(), "): direct path"));
      }
      return std::make_unique<HostRelay>(this, *pool, plan, region, std::move(relay));
    }
    case RelayKind::kGpu: {
      if (relay.peer_access) {
        const absl::Status enabled =
            cuda::EnablePeerAccess(relay.kernel_device, relay.relay_device);
        if (!enabled.ok()) {
          return not_made(absl::StrCat(relay.reason, "; peer access GPU", relay.kernel_device,
                                       " -> GPU", relay.relay_device, " refused (",
                                       enabled.message(), "): direct path"));
        }
      }
      absl::StatusOr<SlotPool*> pool = GpuPool(relay.relay_device);
      if (!pool.ok()) {
        return not_made(
            absl::StrCat(relay.reason, "; not made (", pool.status().message(), "): direct path"));
      }
      return std::make_unique<GpuRelay>(this, *pool, plan, region, std::move(relay));
    }
  }
  return nullptr;
}

}  // namespace

std::unique_ptr<RelayStage> RelayStage::Create(RelaySide side, const FabricOptions& options,
                                               const RelayConfig& config,
                                               LaneLoadSource lane_load) {
  return std::make_unique<RelayStageImpl>(side, options, config, std::move(lane_load));
}

uint64_t ProcessRelayedTiles(RelaySide side) {
  return g_relayed[side == RelaySide::kSend ? 0 : 1].load(std::memory_order_relaxed);
}

void NoteRelay(const RelayNote& note, std::string* why) {
  switch (note.kind) {
    case RelayNote::Kind::kRelayed:
      *why = note.text;
      return;
    case RelayNote::Kind::kSaid:
      *why = why->empty() ? note.text : absl::StrCat(*why, "; ", note.text);
      return;
    case RelayNote::Kind::kQuiet:
      return;
  }
}

}  // namespace kvrail::fabric
