#include "daemon/fabric/lane_route.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/scheduler/rails.h"
#include "topology/topology.h"

namespace kvrail::fabric {
namespace {

LaneRoute All(uint32_t lanes, const std::string& why) {
  LaneRoute r;
  r.all = true;
  for (uint32_t l = 0; l < lanes; ++l) {
    r.lanes.push_back(l);
    r.shares.push_back(1.0 / lanes);
  }
  r.reason = absl::StrCat(why, ": all ", lanes, lanes == 1 ? " lane" : " lanes");
  return r;
}

// The peer's routing view from its directory record, as scheduler::BuildRailNode numbers it:
// fabric NICs (the RDMA capable ones; all when none is) in PCI bus-id order, a NIC's rail its
// position; a GPU's NICs those whose record lists its index. The record has no PCIe path
// classes: every GPU's NICs count as the same tier, so the sender's side ranks the plans.
scheduler::RailNode PeerRailNode(const v1::DirectoryNodeRecord& rec) {
  bool any_rdma = false;
  for (const auto& nic : rec.nics()) any_rdma = any_rdma || nic.rdma_capable();
  std::vector<const v1::DirectoryNic*> fabric;
  for (const auto& nic : rec.nics()) {
    if (!any_rdma || nic.rdma_capable()) fabric.push_back(&nic);
  }
  std::sort(fabric.begin(), fabric.end(), [](const v1::DirectoryNic* x, const v1::DirectoryNic* y) {
    return x->pci_bus_id() != y->pci_bus_id() ? x->pci_bus_id() < y->pci_bus_id()
                                              : x->name() < y->name();
  });
  scheduler::RailNode node;
  node.hostname = rec.node_id();
  int gpus = 0;
  for (const auto& gpu : rec.gpus()) gpus = std::max(gpus, gpu.index() + 1);
  node.gpus.resize(gpus);
  for (size_t i = 0; i < fabric.size(); ++i) {
    scheduler::RailNic nic;
    nic.name = fabric[i]->name();
    nic.rail = static_cast<int>(i);
    nic.gbps = fabric[i]->link_speed_gbps() / 8;
    node.nics.push_back(nic);
    for (int g : fabric[i]->rails()) {
      if (g < 0 || g >= gpus) continue;
      scheduler::RailNode::GpuNics& near = node.gpus[g];
      near.nics.push_back(static_cast<int>(i));
      near.tier = scheduler::NicTier::kSwitch;
      near.gbps = near.gbps > 0 ? std::min(near.gbps, nic.gbps) : nic.gbps;
    }
  }
  node.nvlink_gbps.assign(gpus, std::vector<double>(gpus, 0));
  node.nvlink_count.assign(gpus, std::vector<int>(gpus, 0));
  return node;
}

std::string LaneList(const std::vector<uint32_t>& lanes) {
  return absl::StrCat(lanes.size() == 1 ? "lane " : "lanes ", absl::StrJoin(lanes, ","));
}

}  // namespace

std::string NicOfLaneName(const std::string& lane_name) {
  return lane_name.substr(0, lane_name.find('@'));
}

int GpuIndexOf(const v1::TopologyDesc& desc, const std::string& uuid, int ordinal) {
  int found = -1, matches = 0;
  for (const auto& gpu : desc.gpus()) {
    if (!uuid.empty()) {
      if (absl::EqualsIgnoreCase(gpu.uuid(), uuid)) return gpu.index();
      continue;
    }
    if (ordinal >= 0 && gpu.cuda_ordinal() == ordinal) {
      found = gpu.index();
      ++matches;
    }
  }
  return matches == 1 ? found : -1;
}

std::string NicOfInterface(const v1::TopologyDesc& desc, const std::string& interface) {
  if (interface.empty()) return "";
  for (const auto& nic : desc.nics()) {
    if (nic.netdev() == interface || nic.name() == interface) return nic.name();
  }
  return "";
}

namespace {

// ChooseLanes without the load: which lanes, from the topologies.
LaneRoute LanesByTopology(const LaneRouteInput& in) {
  const uint32_t n = in.lanes;
  if (n == 0) return LaneRoute{true, {}, {}, "no lanes"};
  if (n == 1) return All(n, "one lane");
  if (in.src_gpu < 0) return All(n, "host source");
  if (in.local == nullptr) return All(n, "no local topology");
  auto built = scheduler::BuildRailNode(*in.local);
  if (!built.ok()) return All(n, absl::StrCat("local topology: ", built.status().message()));
  const scheduler::RailNode& node = *built;
  if (static_cast<size_t>(in.src_gpu) >= node.gpus.size()) {
    return All(n, absl::StrCat("GPU", in.src_gpu, " not in the local topology"));
  }
  // Local lane -> index into node.nics.
  std::map<std::string, int> local_index;
  for (size_t i = 0; i < node.nics.size(); ++i) local_index.emplace(node.nics[i].name, i);
  std::vector<int> lane_nic(n, -1);
  bool any_mapped = false;
  for (uint32_t l = 0; l < n && l < in.local_lane_nics.size(); ++l) {
    auto it = local_index.find(in.local_lane_nics[l]);
    if (it != local_index.end()) {
      lane_nic[l] = it->second;
      any_mapped = true;
    }
  }
  if (!any_mapped) return All(n, "lanes not mapped to topology NICs");
  const scheduler::RailNode::GpuNics& near = node.gpus[in.src_gpu];
  const std::set<int> near_set(near.nics.begin(), near.nics.end());
  std::vector<uint32_t> local_near;
  for (uint32_t l = 0; l < n; ++l) {
    if (lane_nic[l] >= 0 && near_set.count(lane_nic[l]) > 0) local_near.push_back(l);
  }
  if (local_near.empty()) {
    std::vector<std::string> names;
    for (int i : near.nics) names.push_back(node.nics[i].name);
    return All(n, absl::StrCat("no lane on GPU", in.src_gpu, "'s nearest NICs (",
                               names.empty() ? "none" : absl::StrJoin(names, ","), ")"));
  }
  if (in.dst_gpu < 0) return All(n, "host destination");
  if (in.peer == nullptr) return All(n, "no directory record for the peer");
  bool dst_known = false;
  for (const auto& gpu : in.peer->gpus()) dst_known = dst_known || gpu.index() == in.dst_gpu;
  if (!dst_known) return All(n, absl::StrCat("peer GPU", in.dst_gpu, " not in its record"));
  // The router (scheduler::ChooseRailRoute) over the lanes this node has: each lane is a pair
  // (local NIC, peer NIC); the route's pairs are the lanes that carry the tiles.
  const scheduler::RailNode peer_node = PeerRailNode(*in.peer);
  std::map<std::string, int> peer_index;
  for (size_t i = 0; i < peer_node.nics.size(); ++i) peer_index.emplace(peer_node.nics[i].name, i);
  std::map<std::pair<int, int>, std::vector<uint32_t>> lanes_of_pair;
  std::set<std::pair<int, int>> pairs;
  for (uint32_t l = 0; l < n && l < in.peer_lane_nics.size(); ++l) {
    auto it = peer_index.find(in.peer_lane_nics[l]);
    if (lane_nic[l] < 0 || it == peer_index.end()) continue;
    pairs.emplace(lane_nic[l], it->second);
    lanes_of_pair[{lane_nic[l], it->second}].push_back(l);
  }
  if (pairs.empty()) return All(n, "peer's lanes not mapped to its NICs");
  scheduler::RailOptions options;
  options.hierarchical = false;  // each side's relay is its own (relay.h), decided before
  options.cross_rail = true;
  options.pairs = &pairs;
  absl::StatusOr<scheduler::RailRoute> route =
      scheduler::ChooseRailRoute(node, in.src_gpu, peer_node, in.dst_gpu, {}, options);
  LaneRoute r;
  r.all = false;
  std::string tail;
  if (route.ok()) {
    std::map<uint32_t, double> share_of_lane;  // ascending lanes
    for (const scheduler::RailLane& lane : route->lanes) {
      const std::vector<uint32_t>& lanes = lanes_of_pair[{lane.src_nic, lane.dst_nic}];
      for (uint32_t l : lanes) share_of_lane[l] += lane.share / lanes.size();
    }
    for (const auto& [l, share] : share_of_lane) {
      r.lanes.push_back(l);
      r.shares.push_back(share);
    }
    if (route->cross_rail) tail = " (cross-rail: through the spine)";
  } else {
    // No lane lands near the peer's GPU: the source's lanes (the receiver's write crosses its
    // own PCIe / NVLink), by their NICs' rates.
    r.lanes = local_near;
    tail = absl::StrCat(" (no lane lands near peer GPU", in.dst_gpu, "; NVLink relay not built)");
    double total = 0;
    for (uint32_t l : r.lanes) total += node.nics[lane_nic[l]].gbps;
    for (uint32_t l : r.lanes) {
      r.shares.push_back(total > 0 ? node.nics[lane_nic[l]].gbps / total : 1.0 / r.lanes.size());
    }
  }
  if (r.lanes.size() == n) r.all = true;
  std::vector<std::string> src_names, dst_names;
  std::vector<int> rails;
  auto add = [](auto* v, const auto& x) {  // once each (several lanes may share one NIC)
    if (std::find(v->begin(), v->end(), x) == v->end()) v->push_back(x);
  };
  for (uint32_t l : r.lanes) {
    add(&src_names, node.nics[lane_nic[l]].name);
    add(&dst_names, in.peer_lane_nics[l].empty() ? std::string("?") : in.peer_lane_nics[l]);
    add(&rails, node.nics[lane_nic[l]].rail);
  }
  r.reason = absl::StrCat("GPU", in.src_gpu, " -> ", absl::StrJoin(src_names, ","), " (",
                          topology::PathClassName(near.path_class, 0), ") ",
                          rails.size() == 1 ? "rail " : "rails ", absl::StrJoin(rails, ","),
                          " -> peer ", absl::StrJoin(dst_names, ","), " GPU", in.dst_gpu, ": ",
                          LaneList(r.lanes), " of ", n, tail);
  return r;
}

}  // namespace

LaneRoute ChooseLanes(const LaneRouteInput& in) {
  LaneRoute r = LanesByTopology(in);
  if (r.lanes.size() > 1 && !in.lane_load.empty()) {
    // Least loaded first (stable: equal loads keep lane order); shares stay with their lanes.
    std::vector<size_t> order(r.lanes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto load = [&](uint32_t l) { return l < in.lane_load.size() ? in.lane_load[l] : 0u; };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return load(r.lanes[x]) < load(r.lanes[y]); });
    std::vector<uint32_t> lanes;
    std::vector<double> shares;
    std::vector<std::string> said;
    for (size_t i : order) {
      lanes.push_back(r.lanes[i]);
      shares.push_back(r.shares[i]);
      said.push_back(absl::StrCat(r.lanes[i], ":", load(r.lanes[i])));
    }
    r.lanes = std::move(lanes);
    r.shares = std::move(shares);
    absl::StrAppend(&r.reason, "; by load, tiles out per lane now ", absl::StrJoin(said, " "),
                    ": each tile to the least loaded");
  }
  return r;
}

std::vector<uint32_t> LaneTryOrder(const LaneRoute& route, const std::vector<bool>& usable,
                                   uint32_t rr) {
  auto ok = [&](uint32_t l) { return l < usable.size() && usable[l]; };
  auto rotate = [rr](std::vector<uint32_t> v) {
    if (!v.empty()) std::rotate(v.begin(), v.begin() + rr % v.size(), v.end());
    return v;
  };
  std::vector<uint32_t> chosen;
  for (uint32_t l : route.lanes) {
    if (ok(l)) chosen.push_back(l);
  }
  if (!chosen.empty()) return rotate(std::move(chosen));
  std::vector<uint32_t> others;
  for (uint32_t l = 0; l < usable.size(); ++l) {
    if (ok(l) && std::find(route.lanes.begin(), route.lanes.end(), l) == route.lanes.end()) {
      others.push_back(l);
    }
  }
  return rotate(std::move(others));
}

std::vector<uint32_t> LaneTryOrderByLoad(const LaneRoute& route, const std::vector<bool>& usable,
                                         const std::vector<uint32_t>& load, uint32_t rr) {
  std::vector<uint32_t> order = LaneTryOrder(route, usable, rr);
  auto out = [&](uint32_t l) { return l < load.size() ? load[l] : 0u; };
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t x, uint32_t y) { return out(x) < out(y); });
  return order;
}

}  // namespace kvrail::fabric
