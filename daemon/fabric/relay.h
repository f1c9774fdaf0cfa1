// Internal to the fabric module: the hierarchical path's relay hop
// (PATH_HIERARCHICAL). When a region's GPU has no near NIC, or its NICs are busier than an NVLink
// neighbour's (scheduler::ChooseSideRelay, each daemon deciding its own side), a tile goes through
// a relay slot on that neighbour R before the lane:
//   send:    the pack kernel on the source GPU S writes the tile into a relay slot in R's device
//            memory (peer access: the kernel stores through R's device pointer), then R's stream
//            copies the slot into the lane's pinned host send slot, and the sender posts the
//            command for the lane's proxy;
//   receive: R's stream copies the arrived tile from the host receive slot into a relay slot on
//            R, then the unpack kernel on the destination GPU D reads R's slot over NVLink and
//            scatters it (the layout conversion of the receiver's plan).
// PlanRelay is the pure part (which GPU, which slot, which stream, and why; tested on fixtures);
// RelayStage makes and runs it. A host-memory twin (RelayKind::kHost: the relay slot in host
// memory, the same hops done by the CPU or the copy engines) lets CI run a two-daemon transfer
// through the stage byte for byte without GPUs.
//
// Selection: FabricOptions::relay (fabric.relay in the config; KVRAIL_FABRIC_RELAY in kvraild's
// environment overrides it, config::ApplyEnvironment): "auto" - the hierarchy decides from this
// node's topology; "off" - never; "host" - every transfer relays through the host twin (tests);
// "gpu:<ordinal>" - every GPU region relays through that GPU (tests and the two-GPU validation run;
// gpu:S on a one-GPU machine forces R == S). Anything that prevents a relay (a host region in
// auto/gpu mode, spec.digest, no topology, no peer access, no such GPU, a failed allocation) keeps
// the direct path and the transfer's path reason says why.
//
// Not built: with an FI_HMEM provider the lane could post straight from R's relay slot (fi.h's
// Nic::RegisterDeviceMemory) instead of the copy into the host send slot; the host slot copy is
// always made.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/fabric/fabric_options.h"
#include "daemon/fabric/tile_copy.h"
#include "daemon/planner/planner.h"
#include "daemon/scheduler/rails.h"

namespace kvrail::fabric {

enum class RelayMode { kAuto, kOff, kHost, kGpu };

struct RelayConfig {
  RelayMode mode = RelayMode::kAuto;
  int gpu = -1;       // kGpu: the relay GPU (CUDA ordinal)
  std::string error;  // a value that did not parse (mode is then kOff); said in path reasons
};
// Parses fabric.relay's value (nullptr or empty: auto). FinalizeConfig has refused what does not
// parse; `error` is for values given here directly.
RelayConfig ParseRelayConfig(const char* value);

// The live load the hierarchy's "busier than a neighbour" rule reads: tiles this
// daemon has out per local lane now (written, not yet credited; to every peer), indexed like
// FabricOptions::lane_nics - the sender's figure for load-aware lane choice (lane_route.h
// LaneTryOrderByLoad). Thread contract of a source: called by RelayStage::ForTransfer on the
// thread that begins a transfer, concurrently from several; it must be thread-safe and must not
// block (the sender's reads per-lane atomics, relaxed, without a lock: a snapshot in which each
// lane's count is one that was true, not necessarily all at the same instant).
using LaneLoadSource = std::function<std::vector<uint32_t>()>;

// The NIC load the hierarchy decides on, gathered from the lanes' (pure): each lane's tiles
// added to its topology NIC (FabricOptions::lane_nics[l], several lanes on one NIC add up);
// lanes not mapped to one of `node`'s fabric NICs count nowhere. A tile out counts as
// `tile_bytes` queued (the slot size: the largest tile, so an upper bound).
struct NicLoad {
  std::vector<uint64_t> bytes;  // per NIC, indexed like node.nics (ChooseSideRelay's nic_load)
  std::vector<uint32_t> tiles;  // per NIC: the tiles out behind `bytes`
};
NicLoad NicLoadOfLanes(const scheduler::RailNode& node, const std::vector<std::string>& lane_nics,
                       const std::vector<uint32_t>& lane_tiles, uint64_t tile_bytes);

enum class RelaySide { kSend, kReceive };
enum class RelayKind {
  kNone,  // the direct path (kernel or copy engines straight between region and lane slot)
  kHost,  // the host twin: relay slot in host memory
  kGpu,   // relay slot in GPU relay_device's memory
};

struct RelayInput {
  RelaySide side = RelaySide::kSend;
  RelayConfig config;
  // The transfer's region on this node: GPU memory of CUDA ordinal `device`, or host memory.
  bool cuda = false;
  int device = -1;
  bool digest = false;  // spec.digest (hashed on the host on the direct path: no relay)
  uint64_t bytes = 0;   // the transfer's bytes (the hierarchy's drain estimate)
  // kAuto: this node's rail view (nullptr: no topology), the region's GPU in it (topology index;
  // -1 unknown), topology index -> CUDA ordinal (-1: not visible here), NIC load by rail index.
  const scheduler::RailNode* node = nullptr;
  int gpu_index = -1;
  std::vector<int> ordinal_of_index;
  std::vector<uint64_t> nic_load;
  // The live figure behind nic_load (NicLoadOfLanes' tiles; empty: none): a relay chosen on load
  // says the tiles out on the NICs that decided it.
  std::vector<uint32_t> nic_tiles;
  // CUDA devices here, and whether kernels on device a may access device b's memory
  // (cudaDeviceCanAccessPeer; injected so the plan stays pure). Null: no peer access anywhere.
  int devices = 0;
  std::function<bool(int a, int b)> can_access_peer;
  // The relay slot pool: one slot per packing (unpacking) thread, each slot_bytes.
  uint32_t slots = 2;
  uint64_t slot_bytes = 0;
};

// Which GPU, which slot, which stream - and why.
struct RelayPlan {
  RelayKind kind = RelayKind::kNone;
  RelaySide side = RelaySide::kSend;
  int region_device = -1;    // S (send) / D (receive); -1 host region
  int relay_device = -1;     // R (kGpu): CUDA ordinal
  int relay_gpu_index = -1;  // R's topology index (auto), else -1: the lane choice's source GPU
  bool peer_access = false;  // region_device's kernels must reach relay_device's memory (R != S)
  // Streams: the calling thread's stream on kernel_device runs the pack/unpack kernel, its
  // stream on copy_device the copy between relay slot and lane slot (kGpu; -1 otherwise).
  int kernel_device = -1;
  int copy_device = -1;
  // Slots: relay slot k of the pool (k < slots) is [RelaySlotOffset(k), + slot_bytes) of the
  // pool's memory (on relay_device for kGpu, host memory for kHost); a tile holds one slot from
  // its pack (arrival) until it is in the send slot (scattered).
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;
  // For the transfer's path reason: "relay: GPU5 -NV18-> GPU6 (mlx5_6, PIX): GPU5's nearest NIC
  // is NODE (...); pack kernel on GPU5 writes GPU6's relay slot over NVLink, GPU6's stream copies
  // it to the send slot" or "relay: none (host region)".
  std::string reason;
  // kNone: a relay was chosen (or forced) but cannot be made here; `reason` ends "direct path".
  bool wanted = false;
  // Auto: the relay was chosen because the region's GPU's NICs were busier than the relay GPU's by
  // more than the margin (scheduler::SideRelay::by_load); `reason` names their loads.
  bool by_load = false;
};
RelayPlan PlanRelay(const RelayInput& in);
uint64_t RelaySlotOffset(const RelayPlan& plan, uint32_t k);

// ForTransfer's word for the transfer's path reason.
struct RelayNote {
  enum class Kind {
    kQuiet,    // auto mode's plain "relay: none (...)": not worth saying
    kSaid,     // no relay, and `text` is added to the direct path's reason: the relay forced or
               // off, a value not understood, or one wanted but not made ("...: direct path")
    kRelayed,  // a relay made: `text` replaces the direct path's reason
  };
  Kind kind = Kind::kQuiet;
  std::string text;
};

// One transfer's relay hop (made by RelayStage::ForTransfer; the plan outlives it). Thread
// contract: any thread; distinct tiles concurrently.
class RelayTransfer {
 public:
  virtual ~RelayTransfer() = default;
  // kSend: `tile` from the region through a relay slot into the host send slot `send_slot`
  // (TileBytes bytes); returns when they are there. The caller posts the command.
  virtual absl::Status Pack(uint32_t tile, uint8_t* send_slot) = 0;
  // kReceive: packed `tile` from the host receive slot through a relay slot into the region;
  // returns when the bytes are written.
  virtual absl::Status Unpack(uint32_t tile, const uint8_t* recv_slot) = 0;
  virtual const RelayPlan& plan() const = 0;
};

// One per side of a daemon's fabric (the sender's, the receiver's): the config, this node's rail
// view, the relay slot pools (host, and per relay GPU, made on first use) and the counts.
// Thread contract: thread-safe.
class RelayStage {
 public:
  virtual ~RelayStage() = default;
  // `config`: normally ParseRelayConfig(options.relay). Slots: max(pack_threads, unpack_threads).
  // `lane_load`: the live lane load (the sender's); each ForTransfer in auto mode reads it and
  // feeds NicLoadOfLanes(its node, options.lane_nics, it, options.slot_bytes) to the hierarchy.
  // Null: no load is known (the receiver's side: its NICs' inbound load is not counted), the
  // decision sees idle NICs.
  static std::unique_ptr<RelayStage> Create(RelaySide side, const FabricOptions& options,
                                            const RelayConfig& config,
                                            LaneLoadSource lane_load = nullptr);
  // The relay for one transfer's `region` (its plan: `plan`, outliving the result); nullptr is
  // the direct path. `note` gets the path reason either way (when the plan wanted a relay that
  // could not be made - peer access refused, no memory - it says so and that the direct path is
  // taken) and whether it is said (NoteRelay). `gpu_index`: the region's topology index (-1
  // unknown).
  virtual std::unique_ptr<RelayTransfer> ForTransfer(const planner::Plan& plan,
                                                     const RegionSide& region, int gpu_index,
                                                     bool digest, RelayNote* note) = 0;
  // Tiles moved through a relay slot by this stage, each tile of a transfer once (a lane
  // failover's re-send packs it again but is not a second tile).
  virtual uint64_t relayed_tiles() const = 0;
};

// Tiles relayed in this process, per side, counted as relayed_tiles() (the sender's gauges
// report both).
uint64_t ProcessRelayedTiles(RelaySide side);

// A transfer's path note `why` (the direct path's) given ForTransfer's `note`: kRelayed replaces
// it, kSaid is added to it, kQuiet leaves it.
void NoteRelay(const RelayNote& note, std::string* why);

}  // namespace kvrail::fabric
