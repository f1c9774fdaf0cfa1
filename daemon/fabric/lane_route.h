// Internal to the fabric module: rail-aware lane selection (wired conservatively).
// The fabric's lanes are fixed pairs (lane i = this node's FabricConfig.nics[i] and the peer's
// lane i), so what a transfer can choose is WHICH lanes carry its tiles. ChooseLanes picks the
// lanes whose local NIC is among the source GPU's nearest NICs (scheduler/rails.h: same PCIe
// switch, then NUMA node) and, among those, the ones whose peer NIC is near the destination GPU
// on the same rail. A pure function of the inputs (no I/O, no clock): tests run it on the topology
// fixtures. Whenever something it needs is unknown (a host region, a lane not mapped to a
// topology NIC, no directory record for the peer, the peer's lanes not mapped to its NICs, a GPU
// without a NIC on any lane) it returns ALL lanes and says why, which is the fabric's behaviour
// without routing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/topology.pb.h"

namespace kvrail::fabric {

struct LaneRouteInput {
  uint32_t lanes = 0;  // lanes to the peer (PeerConn::lanes)
  // This node's topology; nullptr when unknown.
  const v1::TopologyDesc* local = nullptr;
  // Per local lane: the topology NIC (TopologyDesc.nics[].name) it sends through; "" unknown.
  std::vector<std::string> local_lane_nics;
  // The peer's directory record (its NICs with rails, GPUs); nullptr when there is none.
  const v1::DirectoryNodeRecord* peer = nullptr;
  // Per lane: the peer's NIC (DirectoryNic.name) that lane lands on; "" unknown.
  std::vector<std::string> peer_lane_nics;
  // Topology GPU index of the source region on this node / of the destination on the peer;
  // -1 for host memory (or not known).
  int src_gpu = -1;
  int dst_gpu = -1;
  // Per local lane: the tiles this daemon has out on it now (written, not yet
  // credited; to every peer). Empty: unknown. When several lanes are chosen (all lanes too) they
  // are listed least loaded first and the reason says the loads (tiles then go by
  // LaneTryOrderByLoad).
  std::vector<uint32_t> lane_load;
};

struct LaneRoute {
  bool all = true;  // every lane (nothing narrowed)
  // Lane indexes to use (all lanes when `all`): ascending, or least loaded first when
  // LaneRouteInput.lane_load is given.
  std::vector<uint32_t> lanes;
  std::vector<double> shares;  // per entry of `lanes`, by link rate (equal when unknown); sum 1
  // For people, one line: "GPU3 -> mlx5_3 (PIX) rail 3 -> peer mlx5_3 GPU3: lane 3 of 8" or
  // "lanes not mapped to topology NICs: all 8 lanes".
  std::string reason;
};

LaneRoute ChooseLanes(const LaneRouteInput& in);

// The order in which a tile tries lanes (what the sender's slot search would use): the route's
// lanes that are `usable` (LaneHealth::MayUse), rotated by `rr` for striping; when none of them
// is usable, the OTHER usable lanes (lane failover keeps working when the chosen subset is gone);
// empty when no lane is usable. `usable` is indexed by lane; lanes beyond it are unusable.
std::vector<uint32_t> LaneTryOrder(const LaneRoute& route, const std::vector<bool>& usable,
                                   uint32_t rr);

// Load-aware striping, what the sender's slot search uses: LaneTryOrder's lanes
// (the route's usable ones, else the other usable ones) ordered by the tiles out on each now
// (`load`, per local lane over all peers: a NIC shared by several GPUs' transfers counts all of
// them), least first; equal loads keep LaneTryOrder's round-robin order from `rr`. So a tile
// goes to the least busy of its transfer's lanes, and transfers from GPUs that share NICs
// spread over them instead of piling onto the same one. Lanes beyond `load` count as 0.
std::vector<uint32_t> LaneTryOrderByLoad(const LaneRoute& route, const std::vector<bool>& usable,
                                         const std::vector<uint32_t>& load, uint32_t rr);

// The NIC a peer's lane lands on, from the name the peer gave the lane in Hello: a lane mapped to
// a NIC is "<nic>@<address>" (lanes.cc), an unmapped one "nic<i>@<address>" (which names no NIC).
std::string NicOfLaneName(const std::string& lane_name);

// The topology index (Gpu.index) of a region's GPU: by UUID when the region names one (either
// case), else by the daemon's CUDA ordinal when exactly one GPU of `desc` has it; -1 unknown.
int GpuIndexOf(const v1::TopologyDesc& desc, const std::string& uuid, int ordinal);

// The lane's topology NIC name from its net interface (TopologyDesc.nics[].netdev or .name);
// "" when no NIC of `desc` has it.
std::string NicOfInterface(const v1::TopologyDesc& desc, const std::string& interface);

}  // namespace kvrail::fabric
