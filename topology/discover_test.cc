// Discover() against a fake sysfs tree in a temporary folder (no GPU, NVML or RDMA needed).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "topology/topology.h"

namespace kvrail::topology {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

// A PCI function folder with the attributes discovery reads, reachable as bus/pci/devices/<bdf>.
void Device(const fs::path& root, const std::string& chain, const std::string& vendor,
            const std::string& cls, int numa, const std::string& speed = "32.0 GT/s PCIe",
            int width = 16) {
  fs::path dir = root / "devices" / chain;
  Write(dir / "vendor", vendor);
  Write(dir / "device", "0x1234");
  Write(dir / "class", cls);
  Write(dir / "numa_node", std::to_string(numa));
  Write(dir / "current_link_speed", speed);
  Write(dir / "current_link_width", std::to_string(width));
  fs::create_directories(root / "bus/pci/devices");
  fs::create_symlink(dir, root / "bus/pci/devices" / dir.filename());
}

// Two sockets. Socket 0: a PCIe switch with GPU 0000:03:00.0 and the IB HCA mlx5_0 (netdev ib0).
// Socket 1: GPU 0000:82:00.0 on its own host bridge, a virtio eth0. Plus lo (virtual).
fs::path MakeSysfs() {
  char tmpl[] = "/tmp/kvrail_sysfs_XXXXXX";
  fs::path root = mkdtemp(tmpl);
  Write(root / "devices/system/node/node0/cpulist", "0-3");
  Write(root / "devices/system/node/node0/meminfo", "Node 0 MemTotal:       1024 kB");
  Write(root / "devices/system/node/node0/distance", "10 21");
  Write(root / "devices/system/node/node1/cpulist", "4-7");
  Write(root / "devices/system/node/node1/distance", "21 10");
  for (int cpu = 0; cpu < 8; ++cpu) {
    Write(root / "devices/system/cpu" / ("cpu" + std::to_string(cpu)) /
              "topology/physical_package_id",
          cpu < 4 ? "0" : "1");
  }
  const std::string rp = "pci0000:00/0000:00:01.0";
  Device(root, rp, "0x8086", "0x060400", 0);
  Device(root, rp + "/0000:01:00.0", "0x1000", "0x060400", 0);
  Device(root, rp + "/0000:01:00.0/0000:02:00.0", "0x1000", "0x060400", 0);
  Device(root, rp + "/0000:01:00.0/0000:02:01.0", "0x1000", "0x060400", 0);
  Device(root, rp + "/0000:01:00.0/0000:02:00.0/0000:03:00.0", "0x10de", "0x030200", 0);
  const std::string hca = rp + "/0000:01:00.0/0000:02:01.0/0000:04:00.0";
  Device(root, hca, "0x15b3", "0x020700", 0);
  fs::create_directories(root / "class/infiniband/mlx5_0/ports/1");
  fs::create_symlink(root / "devices" / hca, root / "class/infiniband/mlx5_0/device");
  Write(root / "class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand");
  Write(root / "class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)");
  fs::create_directories(root / "devices" / hca / "net/ib0");
  fs::create_directories(root / "class/net/ib0");
  fs::create_symlink(root / "devices" / hca, root / "class/net/ib0/device");

  Device(root, "pci0000:80/0000:80:01.0", "0x8086", "0x060400", 1);
  Device(root, "pci0000:80/0000:80:01.0/0000:82:00.0", "0x10de", "0x030000", 1, "16.0 GT/s PCIe",
         8);
  Device(root, "pci0000:80/0000:80:02.0", "0x1af4", "0x020000", 1);
  fs::create_directories(root / "devices/pci0000:80/0000:80:02.0/virtio0");
  fs::create_directories(root / "class/net/eth0");
  fs::create_symlink(root / "devices/pci0000:80/0000:80:02.0/virtio0",
                     root / "class/net/eth0/device");
  Write(root / "class/net/eth0/speed", "25000");
  fs::create_directories(root / "class/net/lo");
  return root;
}

DiscoverOptions SysfsOnly(const fs::path& root) {
  DiscoverOptions options;
  options.sysfs_root = root.string();
  options.probe_cuda = false;
  options.probe_nvml = false;
  options.probe_fabric = false;
  options.hostname = "fake";
  options.mps_pipe_directory = (root / "no-mps").string();
  return options;
}

TEST_CASE("a fake sysfs tree is parsed into GPUs, NICs, NUMA, sockets and the PCIe tree") {
  fs::path root = MakeSysfs();
  absl::StatusOr<TopologyDesc> desc = Discover(SysfsOnly(root));
  REQUIRE(desc.ok());
  REQUIRE(desc->hostname() == "fake");
  REQUIRE(desc->numa_nodes_size() == 2);
  REQUIRE(desc->numa_nodes(0).cpulist() == "0-3");
  REQUIRE(desc->numa_nodes(0).memory_bytes() == 1024 * 1024);
  REQUIRE(desc->numa_nodes(1).socket() == 1);
  REQUIRE(desc->sockets_size() == 2);
  REQUIRE(desc->sockets(1).cpu_count() == 4);

  REQUIRE(desc->gpus_size() == 2);
  REQUIRE(desc->gpus(0).pci_bus_id() == "0000:03:00.0");
  REQUIRE(desc->gpus(0).index() == 0);
  REQUIRE(desc->gpus(0).numa_node() == 0);
  REQUIRE(desc->gpus(1).pci_bus_id() == "0000:82:00.0");
  REQUIRE(desc->gpus(1).numa_node() == 1);
  REQUIRE(desc->gpus(1).cuda_ordinal() == -1);
  REQUIRE(desc->gpu_links_size() == 1);

  REQUIRE(desc->nics_size() == 2);  // ib0 folds into mlx5_0; lo has no PCI function
  const auto& ib = desc->nics(0);
  REQUIRE(ib.name() == "mlx5_0");
  REQUIRE(ib.kind() == ::kvrail::v1::NIC_KIND_INFINIBAND);
  REQUIRE(ib.rdma_capable());
  REQUIRE(ib.link_speed_gbps() == Approx(400));
  REQUIRE(ib.netdev() == "ib0");
  REQUIRE(ib.pci_bus_id() == "0000:04:00.0");
  const auto& eth = desc->nics(1);
  REQUIRE(eth.name() == "eth0");
  REQUIRE(eth.kind() == ::kvrail::v1::NIC_KIND_ETHERNET);
  REQUIRE(eth.pci_bus_id() == "0000:80:02.0");
  REQUIRE(eth.link_speed_gbps() == Approx(25));
  REQUIRE(eth.numa_node() == 1);

  std::map<std::string, ::kvrail::v1::PciDevice> tree;
  for (const auto& dev : desc->pci_devices()) tree[dev.bus_id()] = dev;
  REQUIRE(tree.at("0000:00:01.0").kind() == ::kvrail::v1::PCI_KIND_ROOT_PORT);
  REQUIRE(tree.at("0000:00:01.0").host_bridge() == "pci0000:00");
  REQUIRE(tree.at("0000:01:00.0").kind() == ::kvrail::v1::PCI_KIND_SWITCH_UPSTREAM);
  REQUIRE(tree.at("0000:02:01.0").kind() == ::kvrail::v1::PCI_KIND_SWITCH_DOWNSTREAM);
  REQUIRE(tree.at("0000:03:00.0").kind() == ::kvrail::v1::PCI_KIND_ENDPOINT);
  REQUIRE(tree.at("0000:03:00.0").parent_bus_id() == "0000:02:00.0");
  REQUIRE(tree.at("0000:03:00.0").label() == "GPU0");
  REQUIRE(tree.at("0000:03:00.0").link_gen() == 5);
  REQUIRE(tree.at("0000:82:00.0").link_gen() == 4);
  REQUIRE(tree.at("0000:82:00.0").link_width() == 8);
  REQUIRE(tree.count("0000:80:02.0") == 1);  // the virtio NIC's PCI function

  TopologyGraph g = ComputeGraph(*desc);
  REQUIRE(FindGpuNicPath(g, 0, "mlx5_0")->path_class() == ::kvrail::v1::PATH_PIX);
  REQUIRE(FindGpuNicPath(g, 1, "mlx5_0")->path_class() == ::kvrail::v1::PATH_SYS);
  REQUIRE(FindGpuNicPath(g, 1, "eth0")->path_class() == ::kvrail::v1::PATH_PHB);
  REQUIRE(FindGpuPath(g, 0, 1)->path_class() == ::kvrail::v1::PATH_SYS);
  // Gen4 x8 on GPU1 is the narrowest link: 1.969 x 8 x 0.87.
  REQUIRE(FindGpuPath(g, 0, 1)->bandwidth_gbps() == Approx(13.7).epsilon(0.01));
  fs::remove_all(root);
}

TEST_CASE("a missing sysfs root still gives a valid desc with a note") {
  DiscoverOptions options = SysfsOnly("/nonexistent/kvrail-sysfs");
  absl::StatusOr<TopologyDesc> desc = Discover(options);
  REQUIRE(desc.ok());
  REQUIRE(desc->gpus_size() == 0);
  REQUIRE(desc->notes_size() >= 1);
  REQUIRE(ComputeGraph(*desc).gpu_count() == 0);
}

TEST_CASE("an MPS control pipe marks GPUs mps_active") {
  fs::path root = MakeSysfs();
  DiscoverOptions options = SysfsOnly(root);
  options.mps_pipe_directory = (root / "mps").string();
  Write(root / "mps/control", "");
  absl::StatusOr<TopologyDesc> desc = Discover(options);
  REQUIRE(desc.ok());
  REQUIRE(desc->gpus(0).mps_active());
  fs::remove_all(root);
}

TEST_CASE("the real machine probes without failing (zero GPUs without a driver)") {
  DiscoverOptions options;
  options.mps_pipe_directory = "/nonexistent/kvrail-mps";
  absl::StatusOr<TopologyDesc> desc = Discover(options);
  REQUIRE(desc.ok());
  for (int i = 0; i < desc->gpus_size(); ++i) REQUIRE(desc->gpus(i).index() == i);
  absl::StatusOr<TopologyDesc> again = ParseTopology(DumpTopology(*desc), "probe");
  REQUIRE(again.ok());
}

}  // namespace
}  // namespace kvrail::topology

namespace kvrail::topology {
namespace {

TEST_CASE("a VM's numa_node -1 is placed on the only NUMA node") {
  char tmpl[] = "/tmp/kvrail_sysfs_vm_XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  Write(root / "devices/system/node/node0/cpulist", "0-15");
  Write(root / "devices/system/node/node0/distance", "10");
  const std::string rp = "pci0000:00/0000:00:02.0";
  Device(root, rp, "0x8086", "0x060400", -1);
  Device(root, rp + "/0000:01:00.0", "0x10de", "0x030200", -1);
  Device(root, "pci0000:00/0000:00:03.0", "0x1af4", "0x020000", -1);
  fs::create_directories(root / "devices/pci0000:00/0000:00:03.0/virtio0");
  fs::create_directories(root / "class/net/eth0");
  fs::create_symlink(root / "devices/pci0000:00/0000:00:03.0/virtio0",
                     root / "class/net/eth0/device");
  absl::StatusOr<TopologyDesc> desc = Discover(SysfsOnly(root));
  REQUIRE(desc.ok());
  REQUIRE(desc->numa_nodes_size() == 1);
  REQUIRE(desc->gpus_size() == 1);
  CHECK(desc->gpus(0).numa_node() == 0);
  REQUIRE(desc->nics_size() == 1);
  CHECK(desc->nics(0).numa_node() == 0);
  bool noted = false;
  for (const auto& n : desc->notes()) noted |= n.find("only NUMA node") != std::string::npos;
  CHECK(noted);
  fs::remove_all(root);
}

}  // namespace
}  // namespace kvrail::topology
