#include "daemon/scheduler/rails.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "topology/topology.h"

namespace kvrail::scheduler {
namespace {

NicTier TierOf(v1::PathClass c) {
  switch (c) {
    case v1::PATH_PIX:
    case v1::PATH_PXB:
      return NicTier::kSwitch;
    case v1::PATH_PHB:
    case v1::PATH_NODE:
      return NicTier::kNuma;
    default:
      return NicTier::kFar;
  }
}

std::string ClassName(v1::PathClass c) { return topology::PathClassName(c, 0); }

// Rails as text: "rail 3", "rails 0-3", "rails 1,5".
std::string RailsText(const std::vector<int>& rails) {
  if (rails.empty()) return "no rail";
  if (rails.size() == 1) return absl::StrCat("rail ", rails[0]);
  bool consecutive = true;
  for (size_t i = 1; i < rails.size(); ++i) consecutive &= rails[i] == rails[i - 1] + 1;
  if (consecutive) return absl::StrCat("rails ", rails.front(), "-", rails.back());
  return absl::StrCat("rails ", absl::StrJoin(rails, ","));
}

uint64_t LoadOf(const std::vector<uint64_t>& v, int i) {
  return i >= 0 && static_cast<size_t>(i) < v.size() ? v[i] : 0;
}

struct Plan {
  int exit = -1, entry = -1;
  NicTier tier = NicTier::kFar;
  bool cross = false;
  int relays = 0;
  double cost = 0;    // estimated seconds, relay time included
  double ranked = 0;  // cost as ranked (relay plans: divided by 1 - margin)
  std::vector<RailLane> lanes;
};

// Water-fills `bytes` over lanes with rates r (GB/s) and queued q (bytes): the time T at which
// every lane that takes bytes drains; sets each lane's share.
double WaterFill(std::vector<RailLane>* lanes, const std::vector<double>& queued, double bytes) {
  const size_t n = lanes->size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  auto drain = [&](size_t i) { return queued[i] / ((*lanes)[i].gbps * 1e9); };
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return drain(a) != drain(b) ? drain(a) < drain(b) : a < b; });
  // Add lanes in drain order while the level T stays above the next lane's drain time.
  double rate = 0, queued_sum = 0, level = 0;
  size_t used = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = order[k];
    const double r = (*lanes)[i].gbps * 1e9;
    const double t = (bytes + queued_sum + queued[i]) / (rate + r);
    if (k > 0 && t <= drain(i)) break;
    rate += r;
    queued_sum += queued[i];
    level = t;
    used = k + 1;
  }
  double total = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = order[k];
    double give = k < used ? std::max(0.0, level * (*lanes)[i].gbps * 1e9 - queued[i]) : 0;
    (*lanes)[i].share = give;
    total += give;
  }
  for (auto& lane : *lanes) lane.share = total > 0 ? lane.share / total : 1.0 / n;
  return level;
}

}  // namespace

const char* NicTierName(NicTier tier) {
  switch (tier) {
    case NicTier::kSwitch:
      return "same PCIe switch";
    case NicTier::kNuma:
      return "same NUMA node";
    default:
      return "other socket";
  }
}

absl::StatusOr<RailNode> BuildRailNode(const v1::TopologyDesc& desc) {
  RailNode node;
  node.hostname = desc.hostname();
  const v1::TopologyGraph graph = topology::ComputeGraph(desc);
  bool any_rdma = false;
  for (const auto& nic : desc.nics()) any_rdma = any_rdma || nic.rdma_capable();
  std::vector<int> fabric;
  for (int i = 0; i < desc.nics_size(); ++i) {
    if (!any_rdma || desc.nics(i).rdma_capable()) fabric.push_back(i);
  }
  std::sort(fabric.begin(), fabric.end(), [&](int a, int b) {
    const auto &x = desc.nics(a), &y = desc.nics(b);
    return x.pci_bus_id() != y.pci_bus_id() ? x.pci_bus_id() < y.pci_bus_id() : x.name() < y.name();
  });
  std::map<std::string, int> by_name;
  for (int i : fabric) {
    RailNic nic;
    nic.name = desc.nics(i).name();
    nic.desc_index = i;
    nic.rail = static_cast<int>(node.nics.size());
    nic.gbps = desc.nics(i).link_speed_gbps() / 8;
    by_name[nic.name] = nic.rail;
    node.nics.push_back(nic);
  }
  if (desc.gpus_size() > 0 && node.nics.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("topology '", desc.hostname(),
                                                      "': ", desc.gpus_size(),
                                                      " GPUs and no NIC to route through"));
  }
  const int n = desc.gpus_size();
  node.gpus.resize(n);
  for (const auto& nearest : graph.nearest_nics()) {
    if (nearest.gpu() < 0 || nearest.gpu() >= n) continue;
    RailNode::GpuNics& g = node.gpus[nearest.gpu()];
    for (const auto& name : nearest.nics()) {
      auto it = by_name.find(name);
      if (it != by_name.end()) g.nics.push_back(it->second);
    }
    std::sort(g.nics.begin(), g.nics.end());
    g.path_class = nearest.path_class();
    g.tier = TierOf(nearest.path_class());
    g.gbps = nearest.bandwidth_gbps();
  }
  node.nvlink_gbps.assign(n, std::vector<double>(n, 0));
  node.nvlink_count.assign(n, std::vector<int>(n, 0));
  for (const auto& pair : graph.gpu_pairs()) {
    if (pair.path_class() != v1::PATH_NV || !pair.p2p_supported()) continue;
    const int a = pair.gpu_a(), b = pair.gpu_b();
    if (a < 0 || b < 0 || a >= n || b >= n) continue;
    node.nvlink_gbps[a][b] = node.nvlink_gbps[b][a] = pair.bandwidth_gbps();
    node.nvlink_count[a][b] = node.nvlink_count[b][a] = pair.nvlink_count();
  }
  return node;
}

absl::StatusOr<RailRoute> ChooseRailRoute(const RailNode& src, int src_gpu, const RailNode& dst,
                                          int dst_gpu, const RailLoad& load,
                                          const RailOptions& options) {
  if (src_gpu < 0 || static_cast<size_t>(src_gpu) >= src.gpus.size()) {
    return absl::InvalidArgumentError(absl::StrCat("src_gpu: GPU", src_gpu, " is not a GPU of '",
                                                   src.hostname, "' (", src.gpus.size(), " GPUs)"));
  }
  if (dst_gpu < 0 || static_cast<size_t>(dst_gpu) >= dst.gpus.size()) {
    return absl::InvalidArgumentError(absl::StrCat("dst_gpu: GPU", dst_gpu, " is not a GPU of '",
                                                   dst.hostname, "' (", dst.gpus.size(), " GPUs)"));
  }
  const double bytes = options.bytes > 0 ? static_cast<double>(options.bytes) : double{1 << 20};

  auto candidates = [&](const RailNode& node, int gpu) {
    std::vector<int> out{gpu};
    if (!options.hierarchical) return out;
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      if (static_cast<int>(g) != gpu && node.nvlink_gbps[gpu][g] > 0 &&
          !node.gpus[g].nics.empty()) {
        out.push_back(static_cast<int>(g));
      }
    }
    return out;
  };

  std::vector<Plan> plans;
  for (int exit : candidates(src, src_gpu)) {
    const auto& out = src.gpus[exit];
    if (out.nics.empty()) continue;
    for (int entry : candidates(dst, dst_gpu)) {
      const auto& in = dst.gpus[entry];
      if (in.nics.empty()) continue;
      Plan plan;
      plan.exit = exit;
      plan.entry = entry;
      plan.tier = std::max(out.tier, in.tier);
      plan.relays = (exit != src_gpu) + (entry != dst_gpu);
      const double lane_gbps = std::min(out.gbps, in.gbps);
      for (int s : out.nics) {
        for (int d : in.nics) {
          if (src.nics[s].rail != dst.nics[d].rail) continue;
          if (options.pairs != nullptr && options.pairs->count({s, d}) == 0) continue;
          plan.lanes.push_back(
              RailLane{s, d, src.nics[s].name, dst.nics[d].name, src.nics[s].rail, lane_gbps, 0});
        }
      }
      if (plan.lanes.empty()) {
        if (!options.cross_rail) continue;
        plan.cross = true;
        if (options.pairs != nullptr) {
          for (int s : out.nics) {
            for (int d : in.nics) {
              if (options.pairs->count({s, d}) == 0) continue;
              plan.lanes.push_back(
                  RailLane{s, d, src.nics[s].name, dst.nics[d].name, -1, lane_gbps, 0});
            }
          }
          if (plan.lanes.empty()) continue;
        } else {
          const size_t k = std::min(out.nics.size(), in.nics.size());
          for (size_t i = 0; i < k; ++i) {
            const int s = out.nics[i], d = in.nics[i];
            plan.lanes.push_back(
                RailLane{s, d, src.nics[s].name, dst.nics[d].name, -1, lane_gbps, 0});
          }
        }
      }
      std::vector<double> queued;
      for (const RailLane& lane : plan.lanes) {
        queued.push_back(static_cast<double>(
            std::max(LoadOf(load.src_nics, lane.src_nic), LoadOf(load.dst_nics, lane.dst_nic))));
      }
      plan.cost = WaterFill(&plan.lanes, queued, bytes);
      if (exit != src_gpu) plan.cost += bytes / (src.nvlink_gbps[src_gpu][exit] * 1e9);
      if (entry != dst_gpu) plan.cost += bytes / (dst.nvlink_gbps[dst_gpu][entry] * 1e9);
      const double margin = std::min(std::max(options.relay_margin, 0.0), 0.95);
      plan.ranked = plan.relays > 0 ? plan.cost / (1 - margin) : plan.cost;
      plans.push_back(std::move(plan));
    }
  }
  if (plans.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no route from GPU", src_gpu, " of '", src.hostname, "' to GPU", dst_gpu,
                     " of '", dst.hostname, "': ",
                     src.gpus[src_gpu].nics.empty() || dst.gpus[dst_gpu].nics.empty()
                         ? "a GPU without a NIC and no NVLink neighbour with one"
                     : options.pairs != nullptr ? "no available NIC pair between their NICs"
                                                : "no shared rail and cross-rail routing is off"));
  }
  // Locality tier and staying on rails first; then the fastest, where times within the
  // tolerance of the fastest tie and the tie-breaks decide.
  auto locality = [&](const Plan& p) { return std::make_tuple(static_cast<int>(p.tier), p.cross); };
  auto best_locality = locality(plans[0]);
  for (const Plan& p : plans) best_locality = std::min(best_locality, locality(p));
  double fastest = std::numeric_limits<double>::infinity();
  for (const Plan& p : plans) {
    if (locality(p) == best_locality) fastest = std::min(fastest, p.ranked);
  }
  const double tolerance = std::max(options.cost_tolerance, 0.0);
  // Among relay GPUs, the next after the source (destination) first: uniform sources spread
  // their relays over every rail instead of piling them on GPU0's.
  const int src_n = static_cast<int>(src.gpus.size()), dst_n = static_cast<int>(dst.gpus.size());
  auto key = [&](const Plan& p) {
    return std::make_tuple(p.relays, p.entry != dst_gpu, (p.exit - src_gpu + src_n) % src_n,
                           (p.entry - dst_gpu + dst_n) % dst_n);
  };
  const Plan* best = nullptr;
  for (const Plan& p : plans) {
    if (locality(p) != best_locality || p.ranked > fastest * (1 + tolerance)) continue;
    if (best == nullptr || key(p) < key(*best)) best = &p;
  }
  // The best plan without a relay, to say why a relay won.
  const Plan* direct = nullptr;
  for (const Plan& p : plans) {
    if (p.relays == 0) direct = &p;
  }

  RailRoute route;
  route.src_gpu = src_gpu;
  route.dst_gpu = dst_gpu;
  route.src_exit_gpu = best->exit;
  route.dst_entry_gpu = best->entry;
  route.src_tier = src.gpus[best->exit].tier;
  route.dst_tier = dst.gpus[best->entry].tier;
  route.cross_rail = best->cross;
  route.path = best->relays > 0 ? v1::PATH_HIERARCHICAL : v1::PATH_FABRIC;
  route.lanes = best->lanes;
  route.est_seconds = best->cost;
  for (const RailLane& lane : route.lanes) route.gbps += lane.gbps;

  // "GPU3 -> mlx5_3 (PIX) rail 3 -> peer mlx5_3 (PIX) GPU3"
  std::vector<std::string> src_names, dst_names;
  std::vector<int> rails;
  for (const RailLane& lane : route.lanes) {
    if (std::find(src_names.begin(), src_names.end(), lane.src_name) == src_names.end()) {
      src_names.push_back(lane.src_name);
    }
    if (std::find(dst_names.begin(), dst_names.end(), lane.dst_name) == dst_names.end()) {
      dst_names.push_back(lane.dst_name);
    }
    if (lane.rail >= 0) rails.push_back(lane.rail);
  }
  std::string text = absl::StrCat("GPU", src_gpu);
  if (best->exit != src_gpu) {
    absl::StrAppend(&text, " -NV", src.nvlink_count[src_gpu][best->exit], "-> GPU", best->exit);
  }
  absl::StrAppend(&text, " -> ", absl::StrJoin(src_names, ","), " (",
                  ClassName(src.gpus[best->exit].path_class), ") ",
                  best->cross ? "cross-rail (spine)" : RailsText(rails), " -> peer ",
                  absl::StrJoin(dst_names, ","), " (", ClassName(dst.gpus[best->entry].path_class),
                  ") GPU", best->entry);
  if (best->entry != dst_gpu) {
    absl::StrAppend(&text, " -NV", dst.nvlink_count[best->entry][dst_gpu], "-> GPU", dst_gpu);
  }
  if (route.lanes.size() > 1)
    absl::StrAppend(&text, ", striped over ", route.lanes.size(), " lanes");
  std::vector<std::string> why;
  if (best->relays > 0) {
    const auto& own_src = src.gpus[src_gpu];
    const auto& own_dst = dst.gpus[dst_gpu];
    if (best->exit != src_gpu && own_src.nics.empty()) {
      why.push_back(absl::StrCat("GPU", src_gpu, " has no NIC"));
    } else if (best->exit != src_gpu && own_src.tier > src.gpus[best->exit].tier) {
      why.push_back(absl::StrCat("GPU", src_gpu, "'s nearest NIC is ",
                                 ClassName(own_src.path_class), " (", NicTierName(own_src.tier),
                                 "), GPU", best->exit, "'s ",
                                 ClassName(src.gpus[best->exit].path_class)));
    }
    if (best->entry != dst_gpu && own_dst.nics.empty()) {
      why.push_back(absl::StrCat("peer GPU", dst_gpu, " has no NIC"));
    } else if (best->entry != dst_gpu && own_dst.tier > dst.gpus[best->entry].tier) {
      why.push_back(absl::StrCat("peer GPU", dst_gpu, "'s nearest NIC is ",
                                 ClassName(own_dst.path_class), " (", NicTierName(own_dst.tier),
                                 "), peer GPU", best->entry, "'s ",
                                 ClassName(dst.gpus[best->entry].path_class)));
    }
    if (why.empty() && direct != nullptr && direct->cross && !best->cross) {
      why.push_back(absl::StrCat("no rail shared by GPU", src_gpu, "'s and peer GPU", dst_gpu,
                                 "'s NICs; stays on ", RailsText(rails)));
    }
    if (why.empty() && direct != nullptr) {
      why.push_back(absl::StrFormat("direct NICs busy: %.3f ms to drain vs %.3f ms via the relay",
                                    direct->cost * 1e3, best->cost * 1e3));
    }
  } else {
    if (src.gpus[src_gpu].tier == NicTier::kFar) {
      why.push_back(
          absl::StrCat("no NIC near GPU", src_gpu, " (", ClassName(src.gpus[src_gpu].path_class),
                       ": ", NicTierName(NicTier::kFar), ") and no NVLink neighbour nearer one"));
    }
    if (dst.gpus[dst_gpu].tier == NicTier::kFar) {
      why.push_back(
          absl::StrCat("no NIC near peer GPU", dst_gpu, " and no NVLink neighbour nearer one"));
    }
    if (best->cross) why.push_back("no rail shared by the two GPUs' NICs");
  }
  if (!why.empty()) absl::StrAppend(&text, ": ", absl::StrJoin(why, "; "));
  route.reason = std::move(text);
  return route;
}

absl::StatusOr<SideRelay> ChooseSideRelay(const RailNode& node, int gpu,
                                          const std::vector<uint64_t>& nic_load,
                                          const RailOptions& options) {
  const int n = static_cast<int>(node.gpus.size());
  if (gpu < 0 || gpu >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu: GPU", gpu, " is not a GPU of '", node.hostname, "' (", n, " GPUs)"));
  }
  const double bytes = options.bytes > 0 ? static_cast<double>(options.bytes) : double{1 << 20};
  const double margin = std::min(std::max(options.relay_margin, 0.0), 0.95);
  struct Candidate {
    int gpu = -1;
    double cost = 0, ranked = 0;
  };
  std::vector<Candidate> candidates;
  for (int g = 0; g < n; ++g) {
    if (node.gpus[g].nics.empty()) continue;
    if (g != gpu && (!options.hierarchical || node.nvlink_gbps[gpu][g] <= 0)) continue;
    std::vector<RailLane> lanes;
    std::vector<double> queued;
    for (int nic : node.gpus[g].nics) {
      lanes.push_back(RailLane{nic, nic, node.nics[nic].name, node.nics[nic].name,
                               node.nics[nic].rail, node.gpus[g].gbps, 0});
      queued.push_back(static_cast<double>(LoadOf(nic_load, nic)));
    }
    Candidate c;
    c.gpu = g;
    c.cost = WaterFill(&lanes, queued, bytes);
    if (g != gpu) c.cost += bytes / (node.nvlink_gbps[gpu][g] * 1e9);
    c.ranked = g != gpu ? c.cost / (1 - margin) : c.cost;
    candidates.push_back(c);
  }
  if (candidates.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU", gpu, " of '", node.hostname, "': no NIC and no NVLink neighbour with one"));
  }
  NicTier best_tier = NicTier::kFar;
  for (const Candidate& c : candidates) best_tier = std::min(best_tier, node.gpus[c.gpu].tier);
  double fastest = std::numeric_limits<double>::infinity();
  for (const Candidate& c : candidates) {
    if (node.gpus[c.gpu].tier == best_tier) fastest = std::min(fastest, c.ranked);
  }
  const double tolerance = std::max(options.cost_tolerance, 0.0);
  auto key = [&](const Candidate& c) {
    return std::make_tuple(c.gpu != gpu, (c.gpu - gpu + n) % n);
  };
  const Candidate* best = nullptr;
  const Candidate* direct = nullptr;
  for (const Candidate& c : candidates) {
    if (c.gpu == gpu) direct = &c;
    if (node.gpus[c.gpu].tier != best_tier || c.ranked > fastest * (1 + tolerance)) continue;
    if (best == nullptr || key(c) < key(*best)) best = &c;
  }
  SideRelay out;
  out.gpu = gpu;
  out.relay_gpu = best->gpu;
  out.path = best->gpu != gpu ? v1::PATH_HIERARCHICAL : v1::PATH_FABRIC;
  const auto& via = node.gpus[best->gpu];
  out.tier = via.tier;
  out.nics = via.nics;
  std::vector<std::string> names;
  for (int nic : via.nics) names.push_back(node.nics[nic].name);
  std::string text = absl::StrCat("GPU", gpu);
  if (best->gpu != gpu) {
    out.nvlinks = node.nvlink_count[gpu][best->gpu];
    absl::StrAppend(&text, " -NV", out.nvlinks, "-> GPU", best->gpu);
  }
  absl::StrAppend(&text, " (", absl::StrJoin(names, ","), ", ", ClassName(via.path_class), ")");
  const auto& own = node.gpus[gpu];
  if (best->gpu != gpu) {
    if (own.nics.empty()) {
      absl::StrAppend(&text, ": GPU", gpu, " has no NIC");
    } else if (own.tier > via.tier) {
      absl::StrAppend(&text, ": GPU", gpu, "'s nearest NIC is ", ClassName(own.path_class), " (",
                      NicTierName(own.tier), "), GPU", best->gpu, "'s ", ClassName(via.path_class));
    } else if (direct != nullptr) {
      // The loads that decided it: each NIC of the two GPUs with its queued bytes.
      auto queued = [&](const std::vector<int>& nics) {
        std::vector<std::string> parts;
        for (int nic : nics) {
          parts.push_back(absl::StrFormat("%s %.1f MiB queued", node.nics[nic].name,
                                          static_cast<double>(LoadOf(nic_load, nic)) / (1 << 20)));
        }
        return absl::StrJoin(parts, ", ");
      };
      out.by_load = true;
      absl::StrAppend(&text, absl::StrFormat(": GPU%d's NICs busy (%s): %.3f ms to drain vs %.3f "
                                             "ms via GPU%d (%s)",
                                             gpu, queued(own.nics), direct->cost * 1e3,
                                             best->cost * 1e3, best->gpu, queued(via.nics)));
    }
  } else if (own.tier == NicTier::kFar) {
    absl::StrAppend(&text, ": no NVLink neighbour nearer a NIC");
  }
  out.reason = std::move(text);
  return out;
}

LaneStriper::LaneStriper(const RailRoute& route) : current_(route.lanes.size(), 0) {
  for (const RailLane& lane : route.lanes) share_.push_back(lane.share);
}

int LaneStriper::Next() {
  if (share_.empty()) return -1;
  size_t pick = 0;
  for (size_t i = 0; i < share_.size(); ++i) {
    current_[i] += share_[i];
    if (current_[i] > current_[pick] + 1e-12) pick = i;
  }
  current_[pick] -= 1.0;
  return static_cast<int>(pick);
}

std::vector<int> StripeTiles(const RailRoute& route, uint32_t tiles) {
  std::vector<int> out;
  if (route.lanes.empty()) return out;
  out.reserve(tiles);
  LaneStriper striper(route);
  for (uint32_t t = 0; t < tiles; ++t) out.push_back(striper.Next());
  return out;
}

}  // namespace kvrail::scheduler
