// Discover(): runs the sources, merges GPUs by PCI bus id, numbers them in bus-id order (as
// NVML and nvidia-smi do), records GPU pairs, NICs, the PCIe tree and libfabric domains.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "topology/cuda_probe.h"
#include "topology/discover_internal.h"
#include "topology/topology.h"

namespace kvrail::topology {
namespace internal {

PairKey MakePairKey(const std::string& bus_a, const std::string& bus_b) {
  return bus_a < bus_b ? PairKey{bus_a, bus_b} : PairKey{bus_b, bus_a};
}

::kvrail::v1::Gpu* FindOrAddGpu(GpuFacts* facts, const std::string& bus_id) {
  for (auto& gpu : facts->gpus) {
    if (gpu.pci_bus_id() == bus_id) return &gpu;
  }
  ::kvrail::v1::Gpu gpu;
  gpu.set_pci_bus_id(bus_id);
  gpu.set_numa_node(-1);
  gpu.set_cuda_ordinal(-1);
  facts->gpus.push_back(gpu);
  return &facts->gpus.back();
}

void AddSource(::kvrail::v1::Gpu* gpu, const std::string& source) {
  for (const auto& s : gpu->sources()) {
    if (s == source) return;
  }
  gpu->add_sources(source);
}

void ProbeCuda(GpuFacts* facts) {
  CudaProbeResult cuda = RunCudaProbe();
  facts->cuda_runtime_version = cuda.runtime_version;
  if (!cuda.error.empty()) {
    facts->notes.push_back(absl::StrCat("CUDA: no GPU visible (", cuda.error, ")"));
  }
  std::vector<std::string> bus_of(cuda.gpus.size());
  for (const CudaGpu& c : cuda.gpus) {
    std::string bus = NormalizeBusId(c.pci_bus_id);
    bus_of[c.ordinal] = bus;
    auto* gpu = FindOrAddGpu(facts, bus);
    AddSource(gpu, "cuda");
    gpu->set_cuda_ordinal(c.ordinal);
    if (!c.name.empty()) gpu->set_name(c.name);
    if (gpu->uuid().empty()) gpu->set_uuid(c.uuid);
    if (gpu->memory_bytes() == 0) gpu->set_memory_bytes(c.memory_bytes);
    gpu->set_sm_count(c.sm_count);
    gpu->set_compute_capability_major(c.cc_major);
    gpu->set_compute_capability_minor(c.cc_minor);
  }
  for (const CudaPair& p : cuda.pairs) {
    PairFacts& pair = facts->pairs[MakePairKey(bus_of[p.ordinal_a], bus_of[p.ordinal_b])];
    // CUDA's answer is the one that matters for cudaDeviceEnablePeerAccess; it wins over NVML.
    pair.p2p_known = true;
    pair.p2p = p.access_supported;
    pair.atomics = p.atomics;
    pair.perf_rank = p.perf_rank;
  }
}

}  // namespace internal

absl::StatusOr<TopologyDesc> Discover(const DiscoverOptions& options) {
  using namespace internal;  // NOLINT: the sources of this module
  TopologyDesc desc;
  if (!options.hostname.empty()) {
    desc.set_hostname(options.hostname);
  } else {
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) == 0) desc.set_hostname(host);
  }
  desc.set_source("probed by kvrail topology::Discover");
  std::error_code ec;
  const bool have_sysfs = std::filesystem::is_directory(options.sysfs_root, ec);
  if (!have_sysfs) {
    desc.add_notes(
        absl::StrCat("sysfs: ", options.sysfs_root, " not found; no NUMA, NIC or PCIe data"));
  }

  GpuFacts facts;
  if (have_sysfs) {
    ProbeNumaAndSockets(options.sysfs_root, &desc);
    ProbeSysfsGpus(options.sysfs_root, &facts);
  }
  if (options.probe_nvml) ProbeNvml(&facts);
  if (options.probe_cuda) ProbeCuda(&facts);
  for (auto& note : facts.notes) desc.add_notes(note);
  desc.set_driver_version(facts.driver_version);
  desc.set_cuda_runtime_version(facts.cuda_runtime_version);

  std::string mps_dir = options.mps_pipe_directory;
  if (mps_dir.empty()) {
    const char* env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
    mps_dir = env != nullptr && *env != '\0' ? env : "/tmp/nvidia-mps";
  }
  const bool mps = std::filesystem::exists(std::filesystem::path(mps_dir) / "control", ec);

  std::sort(facts.gpus.begin(), facts.gpus.end(),
            [](const auto& x, const auto& y) { return x.pci_bus_id() < y.pci_bus_id(); });
  for (size_t i = 0; i < facts.gpus.size(); ++i) {
    auto* gpu = desc.add_gpus();
    *gpu = facts.gpus[i];
    gpu->set_index(static_cast<int>(i));
    gpu->set_mps_active(mps);
  }
  for (int a = 0; a < desc.gpus_size(); ++a) {
    for (int b = a + 1; b < desc.gpus_size(); ++b) {
      auto it = facts.pairs.find(MakePairKey(desc.gpus(a).pci_bus_id(), desc.gpus(b).pci_bus_id()));
      PairFacts pair = it == facts.pairs.end() ? PairFacts{} : it->second;
      auto* link = desc.add_gpu_links();
      link->set_gpu_a(a);
      link->set_gpu_b(b);
      link->set_nvlink_count(pair.nvlink_count);
      link->set_nvswitch(pair.nvswitch);
      link->set_p2p_supported(pair.p2p);
      link->set_p2p_performance_rank(pair.perf_rank);
      link->set_p2p_atomics(pair.atomics);
    }
  }
  if (have_sysfs) {
    ProbeNics(options.sysfs_root, &desc);
    if (desc.nics_size() == 0) desc.add_notes("sysfs: no PCI network interface found");
    KVRAIL_RETURN_IF_ERROR(BuildPciTree(options.sysfs_root, &desc));
  }
  if (options.probe_fabric) ProbeFabric(&desc);
  // Virtual machines often report numa_node -1 for every PCI device. With a single NUMA node
  // there is only one answer, which is also what nvidia-smi shows.
  if (desc.numa_nodes_size() == 1) {
    const int only = desc.numa_nodes(0).id();
    bool mapped = false;
    for (auto& gpu : *desc.mutable_gpus()) {
      if (gpu.numa_node() < 0) gpu.set_numa_node(only), mapped = true;
    }
    for (auto& nic : *desc.mutable_nics()) {
      if (nic.numa_node() < 0) nic.set_numa_node(only), mapped = true;
    }
    if (mapped) {
      desc.add_notes(
          absl::StrCat("devices without a NUMA node (numa_node -1, usual in VMs) were "
                       "placed on the only NUMA node, ",
                       only));
    }
  }
  return desc;
}

}  // namespace kvrail::topology
