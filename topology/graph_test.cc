// ComputeGraph, ChoosePath and RenderTopology on the fixtures of real machines.
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace kvrail::topology {
namespace {

using ::kvrail::v1::PathClass;

TopologyDesc Fixture(const std::string& name) {
  absl::StatusOr<TopologyDesc> desc = LoadTopologyFile("topology/fixtures/" + name + ".textproto");
  INFO(desc.status().ToString());
  REQUIRE(desc.ok());
  return *desc;
}

PathClass GpuClass(const TopologyGraph& g, int a, int b) {
  const PathInfo* p = FindGpuPath(g, a, b);
  REQUIRE(p != nullptr);
  return p->path_class();
}

PathClass NicClass(const TopologyGraph& g, int gpu, const std::string& nic) {
  const PathInfo* p = FindGpuNicPath(g, gpu, nic);
  REQUIRE(p != nullptr);
  return p->path_class();
}

::kvrail::v1::TransferPath Route(const TopologyGraph& g, int a, int b) {
  absl::StatusOr<GpuRoute> r = ChoosePath(g, a, b);
  REQUIRE(r.ok());
  return r->path();
}

std::vector<std::string> Nearest(const TopologyGraph& g, int gpu) {
  for (const auto& n : g.nearest_nics()) {
    if (n.gpu() == gpu) return {n.nics().begin(), n.nics().end()};
  }
  return {};
}

TEST_CASE("DGX H100: NV18 everywhere, one PIX NIC per GPU, rails by GPU index") {
  TopologyDesc desc = Fixture("dgx_h100");
  TopologyGraph g = ComputeGraph(desc);
  REQUIRE(g.gpu_count() == 8);
  REQUIRE(g.gpu_pairs_size() == 28);
  REQUIRE(g.gpu_nic_paths_size() == 64);
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) {
      const PathInfo* p = FindGpuPath(g, a, b);
      REQUIRE(p->path_class() == ::kvrail::v1::PATH_NV);
      REQUIRE(p->nvlink_count() == 18);
      REQUIRE(p->bandwidth_gbps() == Approx(18 * 26.56));
      REQUIRE(Route(g, a, b) == ::kvrail::v1::TRANSFER_PATH_NVLINK_P2P);
      REQUIRE(PathClassName(p->path_class(), p->nvlink_count()) == "NV18");
    }
  }
  REQUIRE(NicClass(g, 0, "mlx5_0") == ::kvrail::v1::PATH_PIX);
  REQUIRE(NicClass(g, 0, "mlx5_1") == ::kvrail::v1::PATH_NODE);
  REQUIRE(NicClass(g, 0, "mlx5_4") == ::kvrail::v1::PATH_SYS);
  REQUIRE(NicClass(g, 5, "mlx5_5") == ::kvrail::v1::PATH_PIX);
  REQUIRE(NicClass(g, 5, "mlx5_2") == ::kvrail::v1::PATH_SYS);
  // 400 Gb/s caps the PCIe Gen5 x16 path (~54.8 GB/s) at 50 GB/s.
  REQUIRE(FindGpuNicPath(g, 0, "mlx5_0")->bandwidth_gbps() == Approx(50.0));
  REQUIRE(g.rails_size() == 8);
  for (int i = 0; i < 8; ++i) {
    REQUIRE(Nearest(g, i) == std::vector<std::string>{"mlx5_" + std::to_string(i)});
    REQUIRE(g.rails(i).index() == i);
    REQUIRE(g.rails(i).gpu() == i);
    REQUIRE(g.rails(i).nics(0) == "mlx5_" + std::to_string(i));
  }
  REQUIRE(g.routes_size() == 28);
}

TEST_CASE("p5.48xlarge: NV18, four tied EFA devices per GPU form its rail") {
  TopologyGraph g = ComputeGraph(Fixture("p5_48xlarge"));
  REQUIRE(g.gpu_count() == 8);
  REQUIRE(g.nic_count() == 32);
  REQUIRE(GpuClass(g, 0, 7) == ::kvrail::v1::PATH_NV);
  REQUIRE(FindGpuPath(g, 3, 4)->nvlink_count() == 18);
  REQUIRE(Route(g, 3, 4) == ::kvrail::v1::TRANSFER_PATH_NVLINK_P2P);
  REQUIRE(Nearest(g, 0) ==
          std::vector<std::string>{"rdmap19s0", "rdmap20s0", "rdmap21s0", "rdmap22s0"});
  REQUIRE(g.nearest_nics(0).path_class() == ::kvrail::v1::PATH_PIX);
  REQUIRE(g.nearest_nics(0).bandwidth_gbps() == Approx(12.5));
  REQUIRE(NicClass(g, 0, "rdmap35s0") == ::kvrail::v1::PATH_NODE);
  REQUIRE(NicClass(g, 0, "rdmap147s0") == ::kvrail::v1::PATH_SYS);
  // Every EFA device is on exactly one rail.
  std::set<std::string> seen;
  REQUIRE(g.rails_size() == 8);
  for (const auto& rail : g.rails()) {
    REQUIRE(rail.nics_size() == 4);
    for (const auto& nic : rail.nics()) REQUIRE(seen.insert(nic).second);
  }
  REQUIRE(seen.size() == 32);
}

TEST_CASE("4-GPU PCIe box: PXB p2p within socket 0, PHB staged in socket 1, SYS across") {
  TopologyGraph g = ComputeGraph(Fixture("pcie_4gpu"));
  REQUIRE(GpuClass(g, 0, 1) == ::kvrail::v1::PATH_PXB);
  REQUIRE(GpuClass(g, 2, 3) == ::kvrail::v1::PATH_PHB);
  REQUIRE(GpuClass(g, 0, 2) == ::kvrail::v1::PATH_SYS);
  REQUIRE(GpuClass(g, 1, 3) == ::kvrail::v1::PATH_SYS);
  REQUIRE(Route(g, 0, 1) == ::kvrail::v1::TRANSFER_PATH_PCIE_P2P);
  REQUIRE(Route(g, 1, 0) == ::kvrail::v1::TRANSFER_PATH_PCIE_P2P);
  // Peer access is supported between GPU2 and GPU3, but through the host bridge kvrail stages.
  REQUIRE(FindGpuPath(g, 2, 3)->p2p_supported());
  REQUIRE(Route(g, 2, 3) == ::kvrail::v1::TRANSFER_PATH_PCIE_STAGED);
  REQUIRE(Route(g, 0, 3) == ::kvrail::v1::TRANSFER_PATH_PCIE_STAGED);
  // A100 PCIe Gen4 x16: 1.969 GB/s x 16 lanes x 0.87.
  REQUIRE(FindGpuPath(g, 0, 1)->bandwidth_gbps() == Approx(27.4).epsilon(0.01));
  REQUIRE(NicClass(g, 1, "mlx5_0") == ::kvrail::v1::PATH_PIX);
  REQUIRE(NicClass(g, 0, "mlx5_0") == ::kvrail::v1::PATH_PXB);
  REQUIRE(NicClass(g, 2, "mlx5_0") == ::kvrail::v1::PATH_SYS);
  REQUIRE(NicClass(g, 0, "eno1") == ::kvrail::v1::PATH_NODE);
  // The 1 GbE port is nearer to nobody: only RDMA NICs compete when there are any.
  for (int i = 0; i < 4; ++i) REQUIRE(Nearest(g, i) == std::vector<std::string>{"mlx5_0"});
  REQUIRE(g.nearest_nics(2).path_class() == ::kvrail::v1::PATH_SYS);
  REQUIRE(FindGpuNicPath(g, 1, "mlx5_0")->bandwidth_gbps() == Approx(12.5));
}

TEST_CASE("8-GPU PCIe box with one NIC: PIX, PHB, SYS to the same mlx5_0") {
  TopologyGraph g = ComputeGraph(Fixture("pcie_8gpu_1nic"));
  REQUIRE(g.gpu_count() == 8);
  REQUIRE(GpuClass(g, 0, 1) == ::kvrail::v1::PATH_PIX);
  REQUIRE(GpuClass(g, 0, 2) == ::kvrail::v1::PATH_PHB);
  REQUIRE(GpuClass(g, 0, 4) == ::kvrail::v1::PATH_SYS);
  REQUIRE(Route(g, 0, 1) == ::kvrail::v1::TRANSFER_PATH_PCIE_P2P);
  REQUIRE(Route(g, 0, 2) == ::kvrail::v1::TRANSFER_PATH_PCIE_STAGED);
  REQUIRE(NicClass(g, 1, "mlx5_0") == ::kvrail::v1::PATH_PIX);
  REQUIRE(NicClass(g, 3, "mlx5_0") == ::kvrail::v1::PATH_PHB);
  REQUIRE(NicClass(g, 6, "mlx5_0") == ::kvrail::v1::PATH_SYS);
  for (int i = 0; i < 8; ++i) REQUIRE(Nearest(g, i) == std::vector<std::string>{"mlx5_0"});
  // 200 Gb/s caps the Gen4 x16 path.
  REQUIRE(FindGpuNicPath(g, 0, "mlx5_0")->bandwidth_gbps() == Approx(25.0));
}

TEST_CASE("2x H200 (from the description): NV18 nvlink_p2p, Ethernet only") {
  TopologyGraph g = ComputeGraph(Fixture("h200_2gpu"));
  REQUIRE(g.gpu_count() == 2);
  const PathInfo* p = FindGpuPath(g, 1, 0);
  REQUIRE(p != nullptr);
  REQUIRE(p->path_class() == ::kvrail::v1::PATH_NV);
  REQUIRE(p->nvlink_count() == 18);
  REQUIRE(p->bandwidth_gbps() == Approx(478.08));
  absl::StatusOr<GpuRoute> r = ChoosePath(g, 0, 1);
  REQUIRE(r.ok());
  REQUIRE(r->path() == ::kvrail::v1::TRANSFER_PATH_NVLINK_P2P);
  REQUIRE(r->why().find("NV18") != std::string::npos);
  REQUIRE(Nearest(g, 0) == std::vector<std::string>{"eth0"});
  REQUIRE(g.nearest_nics(0).path_class() == ::kvrail::v1::PATH_PHB);
}

TEST_CASE("1x H200 as probed: one GPU, local route only") {
  TopologyGraph g = ComputeGraph(Fixture("h200_1gpu"));
  REQUIRE(g.gpu_count() == 1);
  REQUIRE(g.gpu_pairs_size() == 0);
  REQUIRE(g.routes_size() == 0);
  REQUIRE(Route(g, 0, 0) == ::kvrail::v1::TRANSFER_PATH_LOCAL);
  REQUIRE(absl::IsNotFound(ChoosePath(g, 0, 1).status()));
  REQUIRE(NicClass(g, 0, "eth0") == ::kvrail::v1::PATH_PHB);
  // The VM reports no PCIe link speed: Gen4 x16 is assumed and the why says so.
  REQUIRE(FindGpuNicPath(g, 0, "eth0")->why().find("assumed") != std::string::npos);
}

TEST_CASE("CPU-only host: an empty but valid graph") {
  TopologyGraph g = ComputeGraph(Fixture("cpu_only"));
  REQUIRE(g.gpu_count() == 0);
  REQUIRE(g.gpu_pairs_size() == 0);
  REQUIRE(g.gpu_nic_paths_size() == 0);
  REQUIRE(g.rails_size() == 0);
  REQUIRE(absl::IsNotFound(ChoosePath(g, 0, 0).status()));
}

TEST_CASE("ComputeGraph is deterministic") {
  TopologyDesc desc = Fixture("p5_48xlarge");
  REQUIRE(ComputeGraph(desc).SerializeAsString() == ComputeGraph(desc).SerializeAsString());
}

TEST_CASE("NVLink without peer access is staged") {
  TopologyDesc desc = Fixture("h200_2gpu");
  desc.mutable_gpu_links(0)->set_p2p_supported(false);
  TopologyGraph g = ComputeGraph(desc);
  REQUIRE(Route(g, 0, 1) == ::kvrail::v1::TRANSFER_PATH_PCIE_STAGED);
}

TEST_CASE("RenderTopology: nvidia-smi style matrix, NIC legend, routes") {
  TopologyDesc desc = Fixture("dgx_h100");
  std::string text = RenderTopology(desc, ComputeGraph(desc));
  REQUIRE(text.find("GPU0   X      NV18") != std::string::npos);
  REQUIRE(text.find("CPU Affinity") != std::string::npos);
  REQUIRE(text.find("NIC0: mlx5_0") != std::string::npos);
  REQUIRE(text.find("GPU0 <-> GPU7: nvlink_p2p") != std::string::npos);
  REQUIRE(text.find("0-55,112-167") != std::string::npos);

  TopologyDesc box = Fixture("pcie_4gpu");
  std::string box_text = RenderTopology(box, ComputeGraph(box));
  REQUIRE(box_text.find("GPU2 <-> GPU3: pcie_staged") != std::string::npos);
  REQUIRE(box_text.find("GPU0 <-> GPU1: pcie_p2p") != std::string::npos);
  REQUIRE(box_text.find("PXB") != std::string::npos);

  TopologyDesc cpu = Fixture("cpu_only");
  std::string cpu_text = RenderTopology(cpu, ComputeGraph(cpu));
  REQUIRE(cpu_text.find("0 GPU(s)") != std::string::npos);
  REQUIRE(cpu_text.find("Discovery notes") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::topology
