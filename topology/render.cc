// RenderTopology: text for people, in the shape of `nvidia-smi topo -m` so operators can compare
// the two side by side, followed by what kvrail itself decides (nearest NICs, rails, routes).
#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "topology/pci_path.h"
#include "topology/topology.h"

namespace kvrail::topology {
namespace {

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

std::string NumaText(int node) { return node < 0 ? "N/A" : absl::StrCat(node); }

}  // namespace

std::string RenderTopology(const TopologyDesc& desc, const TopologyGraph& graph) {
  std::string out;
  absl::StrAppend(&out, "Host ", desc.hostname().empty() ? "(unnamed)" : desc.hostname(), ": ",
                  desc.gpus_size(), " GPU(s), ", desc.nics_size(), " NIC(s), ", desc.sockets_size(),
                  " socket(s), ", desc.numa_nodes_size(), " NUMA node(s)\n");
  for (const auto& gpu : desc.gpus()) {
    absl::StrAppend(
        &out, absl::StrFormat("  GPU%d  %s  %s  sm_%d%d  %d SMs  %.1f GiB%s%s\n", gpu.index(),
                              gpu.name(), gpu.pci_bus_id(), gpu.compute_capability_major(),
                              gpu.compute_capability_minor(), gpu.sm_count(),
                              gpu.memory_bytes() / 1073741824.0, gpu.mig_enabled() ? "  MIG" : "",
                              gpu.mps_active() ? "  MPS" : ""));
  }
  out += "\n";

  // Labels: GPU<i>, NIC<j> like nvidia-smi; the NIC legend maps NIC<j> to its name.
  std::vector<std::string> labels;
  for (const auto& gpu : desc.gpus()) labels.push_back(absl::StrCat("GPU", gpu.index()));
  for (int n = 0; n < desc.nics_size(); ++n) labels.push_back(absl::StrCat("NIC", n));
  const size_t gpus = desc.gpus_size();
  internal::PciIndex pci(desc);
  std::map<int, std::string> cpus_of_node;
  for (const auto& node : desc.numa_nodes()) cpus_of_node[node.id()] = node.cpulist();

  auto numa_of = [&](size_t i) {
    return i < gpus ? desc.gpus(i).numa_node() : desc.nics(i - gpus).numa_node();
  };
  auto cell = [&](size_t r, size_t c) -> std::string {
    if (r == c) return "X";
    if (r < gpus && c < gpus) {
      const PathInfo* p = FindGpuPath(graph, r, c);
      return p ? PathClassName(p->path_class(), p->nvlink_count()) : "?";
    }
    if (r < gpus || c < gpus) {
      size_t g = r < gpus ? r : c, n = r < gpus ? c : r;
      const PathInfo* p = FindGpuNicPath(graph, g, desc.nics(n - gpus).name());
      return p ? PathClassName(p->path_class(), 0) : "?";
    }
    const auto& x = desc.nics(r - gpus);
    const auto& y = desc.nics(c - gpus);
    return PathClassName(
        pci.Classify(x.pci_bus_id(), x.numa_node(), y.pci_bus_id(), y.numa_node()).path_class, 0);
  };

  const size_t w = 7;
  out += Pad("", w);
  for (const auto& l : labels) out += Pad(l, w);
  out += "CPU Affinity    NUMA Affinity\n";
  for (size_t r = 0; r < labels.size(); ++r) {
    out += Pad(labels[r], w);
    for (size_t c = 0; c < labels.size(); ++c) out += Pad(cell(r, c), w);
    const int node = numa_of(r);
    std::string cpus = node >= 0 && cpus_of_node.count(node) ? cpus_of_node[node] : "N/A";
    if (node < 0 && desc.numa_nodes_size() == 1) cpus = desc.numa_nodes(0).cpulist();
    out += Pad(cpus, 16) + NumaText(node) + "\n";
  }
  out += R"(
Legend:
  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
)";
  if (desc.nics_size() > 0) {
    out += "\nNIC Legend:\n";
    for (int n = 0; n < desc.nics_size(); ++n) {
      const auto& nic = desc.nics(n);
      absl::StrAppend(&out,
                      absl::StrFormat("  NIC%d: %s  (%s, %s, %g Gb/s%s)\n", n, nic.name(),
                                      ::kvrail::v1::NicKind_Name(nic.kind()), nic.pci_bus_id(),
                                      nic.link_speed_gbps(), nic.rdma_capable() ? ", RDMA" : ""));
    }
  }
  if (desc.fabric_domains_size() > 0) {
    out += "\nlibfabric (RDM, RMA):\n";
    for (const auto& d : desc.fabric_domains()) {
      absl::StrAppend(&out, "  ", d.provider(), "  domain ", d.domain(), "  fabric ", d.fabric(),
                      "\n");
    }
  }
  if (graph.nearest_nics_size() > 0) {
    out += "\nNearest NICs and rails:\n";
    for (const auto& nearest : graph.nearest_nics()) {
      absl::StrAppend(&out, "  GPU", nearest.gpu(), " -> rail ", nearest.gpu(), ": ",
                      absl::StrJoin(nearest.nics(), ","), "  (", nearest.why(), ")\n");
    }
  }
  if (graph.routes_size() > 0) {
    out += "\nIntra-node paths kvrail would use:\n";
    for (const auto& route : graph.routes()) {
      absl::StrAppend(
          &out,
          absl::StrFormat("  GPU%d <-> GPU%d: %s, ~%.1f GB/s: %s\n", route.gpu_a(), route.gpu_b(),
                          TransferPathName(route.path()), route.bandwidth_gbps(), route.why()));
    }
  } else if (desc.gpus_size() <= 1) {
    out += "\nIntra-node paths kvrail would use: none (fewer than two GPUs)\n";
  }
  if (desc.notes_size() > 0) {
    out += "\nDiscovery notes:\n";
    for (const auto& note : desc.notes()) absl::StrAppend(&out, "  ", note, "\n");
  }
  return out;
}

}  // namespace kvrail::topology
