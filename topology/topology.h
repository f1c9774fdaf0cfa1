// topology: the daemon's picture of the node.
//
// Probing and computing are separate so real machines replay without their hardware:
//   Discover()          probes this machine (CUDA, NVML loaded at run time, sysfs, libfabric)
//                       into a TopologyDesc. Every source is optional: a CPU-only host, a host
//                       without a driver or without RDMA NICs gets a valid desc with notes.
//   LoadTopologyFile()  reads a TopologyDesc written by DumpTopology() (textproto), e.g. a fixture
//                       or `kvraild --topology-file`.
//   ComputeGraph()      pure: path classes (NCCL's NV#/PIX/PXB/PHB/NODE/SYS), bandwidth
//                       estimates, nearest NICs, rails and the intra-node route per GPU pair.
//   RenderTopology()    `nvidia-smi topo -m`-style text; TopologyToJson() for machines.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "proto/kvrail/v1/topology.pb.h"

namespace kvrail::topology {

using ::kvrail::v1::GpuRoute;
using ::kvrail::v1::PathInfo;
using ::kvrail::v1::TopologyDesc;
using ::kvrail::v1::TopologyGraph;

// What Discover() probes. The defaults probe the real machine.
struct DiscoverOptions {
  // Root of sysfs. Tests point it at a fake tree in a temporary folder; it must contain
  // bus/pci/devices, class/net, class/infiniband, devices/system/{node,cpu} as far as they exist
  // (missing folders mean "none of those").
  std::string sysfs_root = "/sys";
  // Probe GPUs through the CUDA runtime (statically linked; no driver means zero GPUs).
  bool probe_cuda = true;
  // Probe GPUs through NVML, dlopen("libnvidia-ml.so.1") at run time (never linked).
  bool probe_nvml = true;
  // List libfabric providers/domains with fi_getinfo.
  bool probe_fabric = true;
  // Host name to record; empty means gethostname().
  std::string hostname;
  // Folder of the CUDA MPS control pipe; empty means $CUDA_MPS_PIPE_DIRECTORY, else
  // /tmp/nvidia-mps.
  std::string mps_pipe_directory;
};

// Probes this machine. Fails only when the result would be wrong (e.g. an unreadable sysfs
// root that exists); missing sources (no GPU, no driver, no NVML, no RDMA, no libfabric
// provider) are recorded in TopologyDesc.notes instead.
absl::StatusOr<TopologyDesc> Discover(const DiscoverOptions& options);

// Parses a textproto TopologyDesc. Errors name the file and the line (and column).
absl::StatusOr<TopologyDesc> LoadTopologyFile(const std::string& path);

// Same as LoadTopologyFile, from text; `name` is used in error messages.
absl::StatusOr<TopologyDesc> ParseTopology(const std::string& text, const std::string& name);

// The desc as textproto, readable by LoadTopologyFile.
std::string DumpTopology(const TopologyDesc& desc);

// Pure: the graph of the desc. Deterministic (same desc, same graph, byte for byte).
TopologyGraph ComputeGraph(const TopologyDesc& desc);

// The path between two GPUs (either order) or nullptr when an index is unknown. Points into
// `graph`.
const PathInfo* FindGpuPath(const TopologyGraph& graph, int gpu_a, int gpu_b);

// The path between a GPU and a NIC (by name) or nullptr. Points into `graph`.
const PathInfo* FindGpuNicPath(const TopologyGraph& graph, int gpu, const std::string& nic);

// The intra-node path kvrail would use from gpu_a to gpu_b: nvlink_p2p for NV#, pcie_p2p for
// PIX/PXB when peer access is supported, pcie_staged (through pinned host memory) otherwise;
// local when a == b. NotFound when an index is not a GPU of the graph.
absl::StatusOr<GpuRoute> ChoosePath(const TopologyGraph& graph, int gpu_a, int gpu_b);

// Short names used in text output: "NV18", "PIX", "SYS"; and "nvlink_p2p", "pcie_staged" (the same
// names as metrics labels, logs and the CLI: one naming of paths everywhere).
std::string PathClassName(::kvrail::v1::PathClass path_class, int nvlink_count);
std::string TransferPathName(::kvrail::v1::TransferPath path);

// Text for people: a GPU/NIC matrix like `nvidia-smi topo -m` (with CPU and NUMA affinity), a
// legend, the NIC legend, nearest NICs and rails, and for each GPU pair the path kvrail would use.
std::string RenderTopology(const TopologyDesc& desc, const TopologyGraph& graph);

// Both messages as JSON (a TopologySnapshot), for `kvrail topo --json`.
absl::StatusOr<std::string> TopologyToJson(const TopologyDesc& desc, const TopologyGraph& graph);

}  // namespace kvrail::topology
