// PCIe path classes, following NCCL's definitions:
//   PIX  at most one PCIe switch between the two (they share a switch, or one is a function of
//        the other's device);
//   PXB  several switches, still below the host bridge;
//   PHB  through a host bridge (root complex) both hang under;
//   NODE different host bridges of one NUMA node;
//   SYS  different NUMA nodes (socket interconnect).
#include "topology/pci_path.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvrail::topology::internal {
namespace {

using ::kvrail::v1::PciDevice;
using ::kvrail::v1::PciKind;

// Per-lane raw rate in GB/s by generation (after 8b/10b or 128b/130b line coding).
double LaneGbps(int gen) {
  switch (gen) {
    case 1:
      return 0.25;
    case 2:
      return 0.5;
    case 3:
      return 0.985;
    case 4:
      return 1.969;
    case 5:
      return 3.938;
    case 6:
      return 7.563;
    default:
      return 0;
  }
}

// Link assumed when the tree does not say (VMs often hide it).
constexpr int kAssumedGen = 4;
constexpr int kAssumedWidth = 16;

}  // namespace

double PcieGbps(int gen, int width) { return LaneGbps(gen) * width * 0.87; }

PciIndex::PciIndex(const ::kvrail::v1::TopologyDesc& desc) {
  for (const auto& dev : desc.pci_devices()) by_bus_[dev.bus_id()] = &dev;
}

const PciDevice* PciIndex::Find(const std::string& bus) const {
  auto it = by_bus_.find(bus);
  return it == by_bus_.end() ? nullptr : it->second;
}

double PciIndex::LinkGbps(const std::string& bus, bool* known) const {
  const PciDevice* dev = Find(bus);
  if (dev == nullptr || dev->link_gen() <= 0 || dev->link_width() <= 0) {
    *known = false;
    return PcieGbps(kAssumedGen, kAssumedWidth);
  }
  *known = true;
  return PcieGbps(dev->link_gen(), dev->link_width());
}

PciPath PciIndex::Classify(const std::string& bus_a, int numa_a, const std::string& bus_b,
                           int numa_b) const {
  PciPath path;
  bool known_a = false, known_b = false;
  path.bandwidth_gbps = std::min(LinkGbps(bus_a, &known_a), LinkGbps(bus_b, &known_b));
  const std::string link_note =
      known_a && known_b ? "" : "; PCIe link width unknown, assumed Gen4 x16";
  const bool numa_differs = numa_a >= 0 && numa_b >= 0 && numa_a != numa_b;
  const PciDevice* a = Find(bus_a);
  const PciDevice* b = Find(bus_b);
  if (a == nullptr || b == nullptr) {
    if (numa_differs) {
      path.path_class = ::kvrail::v1::PATH_SYS;
      path.why = absl::StrCat("not in the PCIe tree; NUMA ", numa_a, " vs ", numa_b,
                              ": across the socket interconnect", link_note);
    } else {
      path.path_class = ::kvrail::v1::PATH_PHB;
      path.why = absl::StrCat(
          "not in the PCIe tree; same NUMA node, assumed through the host "
          "bridge",
          link_note);
    }
    return path;
  }
  // Chains from each function up to its root port, the function itself first.
  auto chain = [&](const PciDevice* dev) {
    std::vector<const PciDevice*> up;
    for (int guard = 0; dev != nullptr && guard < 64; ++guard) {
      up.push_back(dev);
      dev = dev->parent_bus_id().empty() ? nullptr : Find(dev->parent_bus_id());
    }
    return up;
  };
  std::vector<const PciDevice*> up_a = chain(a), up_b = chain(b);
  // Narrowest link on the way up, where the tree knows it.
  for (const auto* chainp : {&up_a, &up_b}) {
    for (const PciDevice* dev : *chainp) {
      if (dev->link_gen() > 0 && dev->link_width() > 0) {
        path.bandwidth_gbps =
            std::min(path.bandwidth_gbps, PcieGbps(dev->link_gen(), dev->link_width()));
      }
    }
  }
  if (a->host_bridge() != b->host_bridge()) {
    if (numa_differs) {
      path.path_class = ::kvrail::v1::PATH_SYS;
      path.why =
          absl::StrCat("host bridges ", a->host_bridge(), " and ", b->host_bridge(), " on NUMA ",
                       numa_a, " and ", numa_b, ": across the socket interconnect", link_note);
    } else {
      path.path_class = ::kvrail::v1::PATH_NODE;
      path.why = absl::StrCat("host bridges ", a->host_bridge(), " and ", b->host_bridge(),
                              " within one NUMA node", link_note);
    }
    return path;
  }
  std::set<const PciDevice*> above_a(up_a.begin(), up_a.end());
  size_t lca_in_b = up_b.size();
  for (size_t i = 0; i < up_b.size(); ++i) {
    if (above_a.count(up_b[i]) != 0) {
      lca_in_b = i;
      break;
    }
  }
  if (lca_in_b == up_b.size()) {
    path.path_class = ::kvrail::v1::PATH_PHB;
    path.why = absl::StrCat("no common bridge below host bridge ", a->host_bridge(), link_note);
    return path;
  }
  // Switches crossed: upstream ports (one per switch) and other bridges strictly between the
  // two functions, the common ancestor included.
  const PciDevice* lca = up_b[lca_in_b];
  std::set<const PciDevice*> between;
  for (const PciDevice* dev : up_a) {
    if (dev != a && dev != b) between.insert(dev);
    if (dev == lca) break;
  }
  for (size_t i = 0; i <= lca_in_b; ++i) {
    if (up_b[i] != a && up_b[i] != b) between.insert(up_b[i]);
  }
  int switches = 0;
  for (const PciDevice* dev : between) {
    if (dev->kind() == PciKind::PCI_KIND_SWITCH_UPSTREAM ||
        dev->kind() == PciKind::PCI_KIND_BRIDGE) {
      ++switches;
    }
  }
  if (switches <= 1) {
    path.path_class = ::kvrail::v1::PATH_PIX;
    path.why = switches == 0
                   ? absl::StrCat("functions of one device / one port", link_note)
                   : absl::StrCat("through one PCIe switch (", lca->bus_id(), ")", link_note);
  } else {
    path.path_class = ::kvrail::v1::PATH_PXB;
    path.why = absl::StrCat(switches, " PCIe switches, below the host bridge", link_note);
  }
  return path;
}

}  // namespace kvrail::topology::internal
