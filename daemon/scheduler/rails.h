// Scheduler: rail-aware routing between two nodes. Which NICs of the sending node and which NICs
// of the receiving node carry a transfer's fabric tiles, striped how, and whether the tiles first
// cross NVLink to another GPU (PATH_HIERARCHICAL, on either side). Pure functions of the two
// nodes' TopologyDescs (through topology::ComputeGraph) and of a load snapshot the caller passes
// in: no I/O, no clocks, no threads, so fixtures of real machines give the same answers in CI as
// on the machines, and a simulation replays them (tests/sim).
//
// Model (docs/fabric.md, "Routing"):
//   * A node's fabric NICs are its RDMA-capable NICs (all NICs when it has none), in PCI bus-id
//     order; a NIC's RAIL is its position in that order, so identical nodes give the same NIC the
//     same rail (DGX H100: mlx5_i on rail i; p5.48xlarge: 32 EFA on rails 0-31, GPU i's four on
//     rails 4i..4i+3; a one-NIC box: rail 0 for everyone). In a rail-optimized fabric rail r of
//     every node hangs off one switch, so NIC pairs on the same rail are one hop apart.
//   * A GPU's NICs are the nearest ones (topology::ComputeGraph's nearest_nics): the same PCIe
//     switch (PIX/PXB: tier kSwitch) before the same NUMA node (PHB/NODE: tier kNuma) before the
//     other socket (SYS: tier kFar). Ties are all used: p5's four EFA per GPU are four lanes.
//   * A plan picks an exit GPU on the sender (the source GPU, or an NVLink neighbour with peer
//     access) and an entry GPU on the receiver (likewise), and pairs the exit GPU's NICs with the
//     entry GPU's NICs of the same rail. Plans are ranked by (1) the worse of the two tiers,
//     (2) staying on rails (a cross-rail plan, through the fabric's spine, only when no plan
//     shares a rail and RailOptions::cross_rail allows it), (3) the estimated time to drain the
//     lanes' queued bytes plus this transfer, water-filled across the lanes, where a plan with an
//     NVLink relay pays the NVLink time and must beat the best plan without one by
//     RailOptions::relay_margin (times within RailOptions::cost_tolerance of the fastest tie),
//     (4) fewer relays, sender-side relay first (NCCL's PXN), then the relay GPU next after
//     the source (destination) GPU in index order, so relays spread over the rails. The winner's
//     lanes carry the transfer in proportion to RailLane::share.
// The result is a plain struct the scheduler consumes. It is the one router: the fabric's sender
// runs it over its lanes (fixed NIC pairs, RailOptions::pairs; daemon/fabric/lane_route.h) and
// the cluster simulation (tests/sim) over whole nodes. The fabric's NVLink relay data path
// (daemon/fabric/relay.h) acts on ChooseSideRelay below: each daemon decides its own side.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/kvrail/v1/topology.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::scheduler {

// How near a GPU's NICs are (best first).
enum class NicTier {
  kSwitch = 0,  // PIX / PXB: the same PCIe switch tree, below the host bridge
  kNuma = 1,    // PHB / NODE: through the CPU's root complex, same NUMA node
  kFar = 2,     // SYS: across the socket interconnect
};
const char* NicTierName(NicTier tier);

// One fabric NIC of a node.
struct RailNic {
  std::string name;     // RDMA device name (mlx5_3, rdmap19s0) or net interface
  int desc_index = -1;  // index in TopologyDesc.nics
  int rail = -1;        // position among the node's fabric NICs in PCI bus-id order
  double gbps = 0;      // link rate in GB/s (link_speed_gbps / 8); 0 when unknown
};

// The routing view of one node, computed once from its desc. Immutable afterwards; share it.
struct RailNode {
  std::string hostname;
  std::vector<RailNic> nics;  // fabric NICs in rail order (nics[r].rail == r)
  struct GpuNics {
    std::vector<int> nics;  // indexes into `nics` of the GPU's nearest fabric NICs (rail order)
    v1::PathClass path_class = v1::PATH_CLASS_UNSPECIFIED;  // to them
    NicTier tier = NicTier::kFar;
    double gbps = 0;  // GPU <-> one of them: narrowest PCIe link, capped by the NIC's rate
  };
  std::vector<GpuNics> gpus;  // by GPU index
  // NVLink rate between two GPUs with peer access (GB/s, one direction), 0 when none. [a][b].
  std::vector<std::vector<double>> nvlink_gbps;
  std::vector<std::vector<int>> nvlink_count;
};

// Builds the view from a desc (pure). FAILED_PRECONDITION "topology '<host>': ..." when the node
// has GPUs but no NIC at all.
absl::StatusOr<RailNode> BuildRailNode(const v1::TopologyDesc& desc);

// Bytes queued on each NIC and not yet on the wire, indexed like RailNode::nics; a shorter (or
// empty) vector means zero for the rest. The scheduler's live load; its snapshot is an input, so
// the decision stays a pure function.
struct RailLoad {
  std::vector<uint64_t> src_nics;
  std::vector<uint64_t> dst_nics;
};

struct RailOptions {
  // Bytes of the transfer (what the lanes' drain estimate adds to the queued bytes). 0 is
  // treated as one tile of 1 MiB.
  uint64_t bytes = 0;
  // Relays over NVLink allowed (PATH_HIERARCHICAL).
  bool hierarchical = true;
  // A plan with a relay must finish at least this fraction sooner than the best plan without one
  // (0.2: 20% sooner), so equal loads never bounce tiles over NVLink.
  double relay_margin = 0.2;
  // Plans whose estimated times (as ranked) are within this fraction of the fastest count as
  // equally fast, and the tie-breaks decide (fewer relays, sender-side relay first): a few
  // queued tiles do not flip a choice back and forth.
  double cost_tolerance = 0.05;
  // When no plan shares a rail (e.g. rails numbered differently on the two nodes), pair NICs of
  // different rails (traffic crosses the fabric's spine). Off: such transfers fail.
  bool cross_rail = true;
  // The NIC pairs (index into the sender's RailNode::nics, index into the receiver's) that can
  // carry tiles; nullptr: every pair. The fabric's lanes are fixed NIC pairs (daemon/fabric/
  // lane_route.h passes them), so its routes use only pairs it has; a cross-rail plan then takes
  // every available pair between the two GPUs' NICs instead of pairing them in order.
  const std::set<std::pair<int, int>>* pairs = nullptr;
};

// One lane: a NIC pair carrying `share` of the transfer's bytes.
struct RailLane {
  int src_nic = -1;  // index into the sender's RailNode::nics
  int dst_nic = -1;  // index into the receiver's RailNode::nics
  std::string src_name, dst_name;
  int rail = -1;     // the rail both NICs are on; -1 for a cross-rail pair
  double gbps = 0;   // the lane's rate: both NICs' GPU paths, both links
  double share = 0;  // fraction of the bytes (shares sum to 1)
};

// What the router returns: consumed by the scheduler (and shown with the transfer).
struct RailRoute {
  v1::Path path = v1::PATH_FABRIC;  // PATH_FABRIC, or PATH_HIERARCHICAL when a relay is used
  int src_gpu = -1, dst_gpu = -1;
  int src_exit_gpu = -1;   // the GPU whose NICs send (src_gpu unless relayed over NVLink)
  int dst_entry_gpu = -1;  // the receiver's GPU whose NICs receive (dst_gpu unless relayed)
  NicTier src_tier = NicTier::kFar, dst_tier = NicTier::kFar;
  bool cross_rail = false;
  std::vector<RailLane> lanes;  // in rail order of the sender's NICs
  double gbps = 0;              // sum of the lanes' rates
  double est_seconds = 0;       // estimated time until this transfer has drained (queued bytes +
                                // its own, water-filled; NVLink relay time added)
  // For people: "GPU3 -> mlx5_3 (PIX) rail 3 -> peer mlx5_3 (PIX) GPU3" (+ why, for relays).
  std::string reason;
};

// Chooses the lanes for a transfer from GPU `src_gpu` of `src` to GPU `dst_gpu` of `dst`.
// Errors: INVALID_ARGUMENT naming src_gpu / dst_gpu when out of range; FAILED_PRECONDITION when
// no plan exists (a side without NICs, or no shared rail with cross_rail off).
absl::StatusOr<RailRoute> ChooseRailRoute(const RailNode& src, int src_gpu, const RailNode& dst,
                                          int dst_gpu, const RailLoad& load,
                                          const RailOptions& options);

// One side's half of the hierarchy, for the fabric's relay data path (daemon/fabric/relay.h):
// which GPU of `node` the fabric tiles of GPU `gpu` leave (sender) or enter (receiver) through,
// knowing only this node (each daemon decides its own side; the peer decides its half). The same
// rules as ChooseRailRoute's for that side: candidates are `gpu` and its NVLink neighbours with
// peer access that have NICs; ranked by (1) the candidate's NIC tier, (2) the estimated drain
// time of its NICs' queued bytes (`nic_load`, indexed like node.nics) plus the transfer
// (options.bytes), water-filled, plus the NVLink hop, a relay having to beat the direct GPU by
// options.relay_margin (times within options.cost_tolerance tie), (3) no relay first, then the
// relay GPU next after `gpu` in index order. options.hierarchical off: never a relay.
struct SideRelay {
  int gpu = -1;                     // the region's GPU (topology index)
  int relay_gpu = -1;               // the GPU whose NICs carry the tiles; == gpu: no relay
  v1::Path path = v1::PATH_FABRIC;  // PATH_HIERARCHICAL when relay_gpu != gpu
  NicTier tier = NicTier::kFar;     // of relay_gpu's NICs
  std::vector<int> nics;            // relay_gpu's nearest fabric NICs (indexes into node.nics)
  int nvlinks = 0;                  // NVLinks between gpu and relay_gpu (0 without a relay)
  // The relay won on load alone: `gpu` has NICs as near as relay_gpu's, but their queued bytes
  // (nic_load) made it slower by more than the margin. The reason then names both GPUs' NICs
  // with their queued bytes.
  bool by_load = false;
  // "GPU5 -NV18-> GPU6 (mlx5_6, PIX): GPU5's nearest NIC is NODE (same NUMA node), GPU6's PIX",
  // "GPU3 (mlx5_3, PIX)", "GPU5 (mlx5_0, SYS): no NVLink neighbour nearer a NIC",
  // "GPU0 -NV18-> GPU1 (mlx5_1, PIX): GPU0's NICs busy (mlx5_0 48.0 MiB queued): 1.342 ms to
  // drain vs 0.893 ms via GPU1 (mlx5_1 0.0 MiB queued)".
  std::string reason;
};
// INVALID_ARGUMENT naming `gpu` when out of range; FAILED_PRECONDITION when neither the GPU nor
// any NVLink neighbour has a NIC.
absl::StatusOr<SideRelay> ChooseSideRelay(const RailNode& node, int gpu,
                                          const std::vector<uint64_t>& nic_load,
                                          const RailOptions& options);

// Which lane carries the next tile of a route: smooth weighted round robin by the lanes' shares
// (deterministic, interleaved; after n tiles each lane has carried within one tile of n x share).
// Not thread-safe: one per transfer, used by its sender.
class LaneStriper {
 public:
  explicit LaneStriper(const RailRoute& route);
  // Index into route.lanes of the next tile's lane; -1 for a route without lanes.
  int Next();

 private:
  std::vector<double> share_, current_;
};

// Static striping of `tiles` equal tiles over the route's lanes in proportion to their shares
// (smooth weighted round robin: deterministic, interleaved, counts within one tile of the
// shares). Entry k is the lane index of tile k.
std::vector<int> StripeTiles(const RailRoute& route, uint32_t tiles);

}  // namespace kvrail::scheduler
