// ComputeGraph and ChoosePath: pure functions of a TopologyDesc / TopologyGraph (no I/O), so
// fixtures of real machines give the same answers here as on the machines.
#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "topology/pci_path.h"
#include "topology/topology.h"

namespace kvrail::topology {
namespace {

using ::kvrail::v1::Gpu;
using ::kvrail::v1::GpuLink;
using ::kvrail::v1::NearestNics;
using ::kvrail::v1::Nic;
using ::kvrail::v1::PathClass;
using ::kvrail::v1::TransferPath;

// Per-link, per-direction NVLink bandwidth by GPU generation (compute capability major):
// NVLink5 (Blackwell) 50 GB/s, NVLink4 (Hopper) 26.56 GB/s (18 links ~ 478 GB/s), NVLink3
// (Ampere) and NVLink2 (Volta) 25 GB/s, NVLink1 (Pascal) 20 GB/s.
double NvLinkGbps(int cc_major, std::string* generation) {
  if (cc_major >= 10) {
    *generation = "NVLink5";
    return 50.0;
  }
  if (cc_major == 9) {
    *generation = "NVLink4";
    return 26.56;
  }
  if (cc_major >= 7) {
    *generation = cc_major == 8 ? "NVLink3" : "NVLink2";
    return 25.0;
  }
  if (cc_major == 6) {
    *generation = "NVLink1";
    return 20.0;
  }
  *generation = "NVLink, generation unknown, assumed NVLink4";
  return 26.56;
}

std::string Gb(double gbps) { return absl::StrFormat("%.1f GB/s", gbps); }

bool SameBandwidth(double x, double y) { return std::fabs(x - y) < 1e-6; }

PathInfo GpuPairPath(const TopologyDesc& desc, const internal::PciIndex& pci, const Gpu& a,
                     const Gpu& b, const GpuLink* link) {
  PathInfo path;
  path.set_a(absl::StrCat("GPU", a.index()));
  path.set_b(absl::StrCat("GPU", b.index()));
  path.set_gpu_a(a.index());
  path.set_gpu_b(b.index());
  path.set_nic(-1);
  path.set_p2p_supported(link != nullptr && link->p2p_supported());
  if (link != nullptr && (link->nvlink_count() > 0 || link->nvswitch())) {
    std::string generation;
    double per_link = NvLinkGbps(
        std::min(a.compute_capability_major(), b.compute_capability_major()), &generation);
    path.set_path_class(::kvrail::v1::PATH_NV);
    path.set_nvlink_count(link->nvlink_count());
    path.set_bandwidth_gbps(link->nvlink_count() * per_link);
    path.set_why(absl::StrCat(link->nvlink_count(), " NVLinks",
                              link->nvswitch() ? " through NVSwitch" : " direct", " x ",
                              absl::StrFormat("%.2f", per_link), " GB/s (", generation, ")"));
    return path;
  }
  internal::PciPath pcie =
      pci.Classify(a.pci_bus_id(), a.numa_node(), b.pci_bus_id(), b.numa_node());
  path.set_path_class(pcie.path_class);
  path.set_bandwidth_gbps(pcie.bandwidth_gbps);
  path.set_why(absl::StrCat("no NVLink; ", pcie.why));
  return path;
}

PathInfo GpuNicPath(const internal::PciIndex& pci, const Gpu& gpu, const Nic& nic, int nic_index) {
  PathInfo path;
  path.set_a(absl::StrCat("GPU", gpu.index()));
  path.set_b(nic.name());
  path.set_gpu_a(gpu.index());
  path.set_gpu_b(-1);
  path.set_nic(nic_index);
  internal::PciPath pcie =
      pci.Classify(gpu.pci_bus_id(), gpu.numa_node(), nic.pci_bus_id(), nic.numa_node());
  path.set_path_class(pcie.path_class);
  double bw = pcie.bandwidth_gbps;
  std::string why = pcie.why;
  if (nic.link_speed_gbps() > 0 && nic.link_speed_gbps() / 8 < bw) {
    bw = nic.link_speed_gbps() / 8;
    absl::StrAppend(&why, "; capped by the NIC's ", absl::StrFormat("%g", nic.link_speed_gbps()),
                    " Gb/s link");
  }
  path.set_bandwidth_gbps(bw);
  path.set_why(why);
  return path;
}

}  // namespace

std::string PathClassName(PathClass path_class, int nvlink_count) {
  switch (path_class) {
    case ::kvrail::v1::PATH_NV:
      return absl::StrCat("NV", nvlink_count);
    case ::kvrail::v1::PATH_PIX:
      return "PIX";
    case ::kvrail::v1::PATH_PXB:
      return "PXB";
    case ::kvrail::v1::PATH_PHB:
      return "PHB";
    case ::kvrail::v1::PATH_NODE:
      return "NODE";
    case ::kvrail::v1::PATH_SYS:
      return "SYS";
    case ::kvrail::v1::PATH_NET:
      return "NET";
    default:
      return "?";
  }
}

std::string TransferPathName(TransferPath path) {
  switch (path) {
    case ::kvrail::v1::TRANSFER_PATH_LOCAL:
      return "cuda_local";
    case ::kvrail::v1::TRANSFER_PATH_NVLINK_P2P:
      return "nvlink_p2p";
    case ::kvrail::v1::TRANSFER_PATH_PCIE_P2P:
      return "pcie_p2p";
    case ::kvrail::v1::TRANSFER_PATH_PCIE_STAGED:
      return "pcie_staged";
    default:
      return "?";
  }
}

TopologyGraph ComputeGraph(const TopologyDesc& desc) {
  TopologyGraph graph;
  graph.set_gpu_count(desc.gpus_size());
  graph.set_nic_count(desc.nics_size());
  internal::PciIndex pci(desc);
  std::map<std::pair<int, int>, const GpuLink*> links;
  for (const auto& link : desc.gpu_links()) links[{link.gpu_a(), link.gpu_b()}] = &link;

  for (int a = 0; a < desc.gpus_size(); ++a) {
    for (int b = a + 1; b < desc.gpus_size(); ++b) {
      auto it = links.find({a, b});
      *graph.add_gpu_pairs() = GpuPairPath(desc, pci, desc.gpus(a), desc.gpus(b),
                                           it == links.end() ? nullptr : it->second);
    }
  }
  for (const auto& gpu : desc.gpus()) {
    for (int n = 0; n < desc.nics_size(); ++n) {
      *graph.add_gpu_nic_paths() = GpuNicPath(pci, gpu, desc.nics(n), n);
    }
  }
  // Nearest NICs: among RDMA-capable NICs when there are any (the fabric path), else among all
  // (the tcp provider); best class first, then bandwidth; ties are all kept.
  bool any_rdma = false;
  for (const auto& nic : desc.nics()) any_rdma = any_rdma || nic.rdma_capable();
  for (const auto& gpu : desc.gpus()) {
    std::vector<const PathInfo*> candidates;
    for (const auto& path : graph.gpu_nic_paths()) {
      if (path.gpu_a() == gpu.index() && (!any_rdma || desc.nics(path.nic()).rdma_capable())) {
        candidates.push_back(&path);
      }
    }
    if (candidates.empty()) continue;
    auto better = [](const PathInfo* x, const PathInfo* y) {
      if (x->path_class() != y->path_class()) return x->path_class() < y->path_class();
      return x->bandwidth_gbps() > y->bandwidth_gbps() &&
             !SameBandwidth(x->bandwidth_gbps(), y->bandwidth_gbps());
    };
    const PathInfo* best = *std::min_element(candidates.begin(), candidates.end(), better);
    std::vector<const Nic*> chosen;
    for (const PathInfo* p : candidates) {
      if (!better(best, p) && !better(p, best)) chosen.push_back(&desc.nics(p->nic()));
    }
    std::sort(chosen.begin(), chosen.end(), [](const Nic* x, const Nic* y) {
      return x->pci_bus_id() != y->pci_bus_id() ? x->pci_bus_id() < y->pci_bus_id()
                                                : x->name() < y->name();
    });
    NearestNics* nearest = graph.add_nearest_nics();
    nearest->set_gpu(gpu.index());
    for (const Nic* nic : chosen) nearest->add_nics(nic->name());
    nearest->set_path_class(best->path_class());
    nearest->set_bandwidth_gbps(best->bandwidth_gbps());
    nearest->set_why(
        absl::StrCat(PathClassName(best->path_class(), 0), " at ", Gb(best->bandwidth_gbps()),
                     chosen.size() > 1 ? absl::StrCat(", ", chosen.size(), " NICs tie") : "",
                     any_rdma ? "" : "; no RDMA NIC on this node, plain Ethernet (tcp provider)",
                     ": ", best->why()));
    auto* rail = graph.add_rails();
    rail->set_index(gpu.index());
    rail->set_gpu(gpu.index());
    *rail->mutable_nics() = nearest->nics();
  }
  for (int a = 0; a < desc.gpus_size(); ++a) {
    for (int b = a + 1; b < desc.gpus_size(); ++b) {
      absl::StatusOr<GpuRoute> route = ChoosePath(graph, a, b);
      if (route.ok()) *graph.add_routes() = *route;
    }
  }
  return graph;
}

const PathInfo* FindGpuPath(const TopologyGraph& graph, int gpu_a, int gpu_b) {
  if (gpu_a > gpu_b) std::swap(gpu_a, gpu_b);
  for (const auto& path : graph.gpu_pairs()) {
    if (path.gpu_a() == gpu_a && path.gpu_b() == gpu_b) return &path;
  }
  return nullptr;
}

const PathInfo* FindGpuNicPath(const TopologyGraph& graph, int gpu, const std::string& nic) {
  for (const auto& path : graph.gpu_nic_paths()) {
    if (path.gpu_a() == gpu && path.b() == nic) return &path;
  }
  return nullptr;
}

absl::StatusOr<GpuRoute> ChoosePath(const TopologyGraph& graph, int gpu_a, int gpu_b) {
  if (gpu_a < 0 || gpu_b < 0 || gpu_a >= graph.gpu_count() || gpu_b >= graph.gpu_count()) {
    return absl::NotFoundError(absl::StrCat("no GPU pair (", gpu_a, ", ", gpu_b,
                                            ") on this node: ", graph.gpu_count(), " GPUs"));
  }
  GpuRoute route;
  route.set_gpu_a(gpu_a);
  route.set_gpu_b(gpu_b);
  if (gpu_a == gpu_b) {
    route.set_path(::kvrail::v1::TRANSFER_PATH_LOCAL);
    route.set_why("same GPU: device-local copy");
    return route;
  }
  const PathInfo* path = FindGpuPath(graph, gpu_a, gpu_b);
  if (path == nullptr) {
    return absl::NotFoundError(absl::StrCat("graph has no path GPU", gpu_a, " - GPU", gpu_b));
  }
  const std::string cls = PathClassName(path->path_class(), path->nvlink_count());
  route.set_path_class(path->path_class());
  route.set_bandwidth_gbps(path->bandwidth_gbps());
  const PathClass c = path->path_class();
  if (c == ::kvrail::v1::PATH_NV && path->p2p_supported()) {
    route.set_path(::kvrail::v1::TRANSFER_PATH_NVLINK_P2P);
    route.set_why(absl::StrCat(cls, ": direct peer access over ", path->why()));
  } else if ((c == ::kvrail::v1::PATH_PIX || c == ::kvrail::v1::PATH_PXB) &&
             path->p2p_supported()) {
    route.set_path(::kvrail::v1::TRANSFER_PATH_PCIE_P2P);
    route.set_why(
        absl::StrCat(cls, " with peer access: PCIe P2P below the host bridge (", path->why(), ")"));
  } else {
    route.set_path(::kvrail::v1::TRANSFER_PATH_PCIE_STAGED);
    std::string reason;
    if (c == ::kvrail::v1::PATH_NV || c == ::kvrail::v1::PATH_PIX || c == ::kvrail::v1::PATH_PXB) {
      reason = "peer access not supported";
      if (c == ::kvrail::v1::PATH_NV) route.set_bandwidth_gbps(0);  // PCIe rate not in the graph
    } else {
      reason = "the path crosses the host bridge/CPU, where PCIe P2P is slow or unsupported";
    }
    route.set_why(
        absl::StrCat(cls, ", ", reason, ": staged through pinned host memory (", path->why(), ")"));
  }
  return route;
}

}  // namespace kvrail::topology
