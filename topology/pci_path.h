// Internal to topology/: the PCIe path class between two PCI functions of a TopologyDesc, used
// by the graph (GPU pairs without NVLink, GPU-NIC pairs) and the renderer (NIC-NIC cells).
#pragma once

#include <map>
#include <string>

#include "proto/kvrail/v1/topology.pb.h"

namespace kvrail::topology::internal {

// Effective one-direction PCIe bandwidth in GB/s for a link: raw lane rate x width x 0.87
// (TLP/DLLP overhead). Gen5 x16 gives ~54.8, matching the 55 GB/s measured GPU -> host on H200.
double PcieGbps(int gen, int width);

struct PciPath {
  ::kvrail::v1::PathClass path_class = ::kvrail::v1::PATH_CLASS_UNSPECIFIED;
  double bandwidth_gbps = 0;  // narrowest known link on the path
  std::string why;
};

// Looks up PCI functions of one desc; keeps a pointer to it.
class PciIndex {
 public:
  explicit PciIndex(const ::kvrail::v1::TopologyDesc& desc);

  // Class of the path between two functions. `numa_a`/`numa_b` decide NODE vs SYS when the
  // host bridges differ, and stand in when a function is missing from the tree.
  PciPath Classify(const std::string& bus_a, int numa_a, const std::string& bus_b,
                   int numa_b) const;

 private:
  const ::kvrail::v1::PciDevice* Find(const std::string& bus) const;
  double LinkGbps(const std::string& bus, bool* known) const;

  std::map<std::string, const ::kvrail::v1::PciDevice*> by_bus_;
};

}  // namespace kvrail::topology::internal
