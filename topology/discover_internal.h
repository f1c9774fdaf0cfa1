// Internal to topology/: the probing sources behind Discover(). Each source only adds what it
// saw; Discover() merges GPUs by PCI bus id, numbers them, and builds the PCIe tree last.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/kvrail/v1/topology.pb.h"

namespace kvrail::topology::internal {

// Facts about one unordered GPU pair, keyed by the pair's PCI bus ids (smaller first).
struct PairFacts {
  int nvlink_count = 0;
  bool nvswitch = false;
  bool p2p_known = false;  // some source answered the P2P question
  bool p2p = false;        // read and write peer access both supported
  int perf_rank = -1;
  bool atomics = false;
};
using PairKey = std::pair<std::string, std::string>;
PairKey MakePairKey(const std::string& bus_a, const std::string& bus_b);

// What the GPU sources (sysfs, NVML, CUDA) found, before numbering.
struct GpuFacts {
  std::vector<::kvrail::v1::Gpu> gpus;  // keyed by pci_bus_id; index not yet assigned
  std::map<PairKey, PairFacts> pairs;
  std::vector<std::string> notes;
  std::string driver_version;
  int cuda_runtime_version = 0;
};

// The GPU with this bus id, added (with numa_node -1, cuda_ordinal -1) when absent.
::kvrail::v1::Gpu* FindOrAddGpu(GpuFacts* facts, const std::string& bus_id);
void AddSource(::kvrail::v1::Gpu* gpu, const std::string& source);

// "00000000:18:00.0", "0000:18:00.0" or "18:00.0" -> "0000:18:00.0" (lower case, 4-digit domain).
std::string NormalizeBusId(std::string_view bus_id);
// True for a PCI address component as sysfs names it ("0000:18:00.0").
bool IsBusId(std::string_view s);

// sysfs (sysfs.cc). `root` is DiscoverOptions.sysfs_root.
void ProbeNumaAndSockets(const std::string& root, ::kvrail::v1::TopologyDesc* desc);
void ProbeSysfsGpus(const std::string& root, GpuFacts* facts);  // NVIDIA display/3D controllers
void ProbeNics(const std::string& root, ::kvrail::v1::TopologyDesc* desc);
// Records GPUs, NICs and every bridge above them; fills missing numa_node of GPUs and NICs.
absl::Status BuildPciTree(const std::string& root, ::kvrail::v1::TopologyDesc* desc);

// NVML loaded at run time (nvml.cc); a missing library or driver is a note.
void ProbeNvml(GpuFacts* facts);
// CUDA runtime (cuda_source.cc over cuda_probe.cu); no driver/device is a note.
void ProbeCuda(GpuFacts* facts);
// libfabric fi_getinfo (fabric.cc); no provider is a note.
void ProbeFabric(::kvrail::v1::TopologyDesc* desc);

}  // namespace kvrail::topology::internal
