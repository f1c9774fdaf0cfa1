// Route choice on fixtures of real machines: host/host, same GPU, GPU <-> host, NVLink pairs,
// PCIe pairs, unknown GPUs, and no CUDA engine.
#include "daemon/scheduler/route.h"

#include <catch2/catch.hpp>
#include <string>

#include "topology/topology.h"

namespace kvrail::scheduler {
namespace {

struct Machine {
  v1::TopologyDesc desc;
  v1::TopologyGraph graph;
  std::vector<int> index;
};

Machine Load(const std::string& name) {
  auto desc = topology::LoadTopologyFile("topology/fixtures/" + name + ".textproto");
  REQUIRE(desc.ok());
  Machine m{*desc, topology::ComputeGraph(*desc), GpuIndexByOrdinal(*desc)};
  return m;
}

const Placement kHost{false, -1};
Placement Gpu(int d) { return Placement{true, d}; }

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("host to host: the host engine") {
  Machine m = Load("cpu_only");
  auto r = ChooseRoute(kHost, kHost, m.graph, m.index, /*have_cuda_engine=*/false);
  REQUIRE(r.ok());
  CHECK(r->engine == EngineKind::kHost);
  CHECK(r->path == v1::PATH_HOST_LOCAL);
}

TEST_CASE("GPU memory without a CUDA engine names the region field") {
  Machine m = Load("cpu_only");
  auto r = ChooseRoute(Gpu(0), kHost, m.graph, m.index, false);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Has(std::string(r.status().message()), "spec.src.region_id"));
  r = ChooseRoute(kHost, Gpu(0), m.graph, m.index, false);
  REQUIRE(!r.ok());
  CHECK(Has(std::string(r.status().message()), "spec.dst.region_id"));
}

TEST_CASE("one H200: same GPU and GPU <-> host are CUDA-local") {
  Machine m = Load("h200_1gpu");
  auto r = ChooseRoute(Gpu(0), Gpu(0), m.graph, m.index, true);
  REQUIRE(r.ok());
  CHECK(r->engine == EngineKind::kCuda);
  CHECK(r->path == v1::PATH_CUDA_LOCAL);
  CHECK(Has(r->reason, "same GPU"));
  r = ChooseRoute(Gpu(0), kHost, m.graph, m.index, true);
  REQUIRE(r.ok());
  CHECK(r->path == v1::PATH_CUDA_LOCAL);
  CHECK(Has(r->reason, "GPU0 -> host memory"));
  r = ChooseRoute(kHost, Gpu(0), m.graph, m.index, true);
  REQUIRE(r.ok());
  CHECK(r->path == v1::PATH_CUDA_LOCAL);
  CHECK(Has(r->reason, "host memory -> GPU0"));
}

TEST_CASE("two H200s over NV18: NVLink P2P with the reason from the topology") {
  Machine m = Load("h200_2gpu");
  auto r = ChooseRoute(Gpu(0), Gpu(1), m.graph, m.index, true);
  REQUIRE(r.ok());
  CHECK(r->engine == EngineKind::kCuda);
  CHECK(r->path == v1::PATH_NVLINK_P2P);
  INFO(r->reason);
  CHECK(Has(r->reason, "GPU0-GPU1 NV18"));
  r = ChooseRoute(Gpu(1), Gpu(0), m.graph, m.index, true);
  REQUIRE(r.ok());
  CHECK(r->path == v1::PATH_NVLINK_P2P);
  CHECK(Has(r->reason, "GPU1-GPU0"));
}

TEST_CASE("DGX H100: every pair is NVLink") {
  Machine m = Load("dgx_h100");
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      auto r = ChooseRoute(Gpu(a), Gpu(b), m.graph, m.index, true);
      REQUIRE(r.ok());
      CHECK(r->path == (a == b ? v1::PATH_CUDA_LOCAL : v1::PATH_NVLINK_P2P));
    }
  }
}

TEST_CASE("PCIe machine: pairs follow ChoosePath (P2P below a switch, staged across the CPU)") {
  Machine m = Load("pcie_4gpu");
  int p2p = 0, staged = 0;
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) {
      if (a == b) continue;
      auto r = ChooseRoute(Gpu(a), Gpu(b), m.graph, m.index, true);
      REQUIRE(r.ok());
      auto expected = topology::ChoosePath(m.graph, a, b);
      REQUIRE(expected.ok());
      INFO(r->reason);
      if (expected->path() == v1::TRANSFER_PATH_PCIE_P2P) {
        CHECK(r->path == v1::PATH_PCIE_P2P);
        ++p2p;
      } else {
        CHECK(r->path == v1::PATH_PCIE_STAGED);
        CHECK(Has(r->reason, "copy engines"));
        ++staged;
      }
    }
  }
  CHECK(p2p + staged == 12);
  CHECK(staged > 0);
}

TEST_CASE("GPUs the graph does not know: unspecified path with a reason") {
  Machine m = Load("h200_1gpu");
  auto r = ChooseRoute(Gpu(0), Gpu(3), m.graph, m.index, true);
  REQUIRE(r.ok());
  CHECK(r->engine == EngineKind::kCuda);
  CHECK(r->path == v1::PATH_UNSPECIFIED);
  CHECK(Has(r->reason, "not in the topology graph"));
}

TEST_CASE("ordinals map to graph indexes through the desc") {
  v1::TopologyDesc desc;
  auto* g0 = desc.add_gpus();
  g0->set_index(0);
  g0->set_cuda_ordinal(1);
  auto* g1 = desc.add_gpus();
  g1->set_index(1);
  g1->set_cuda_ordinal(0);
  CHECK(GpuIndexByOrdinal(desc) == std::vector<int>{1, 0});
}

}  // namespace
}  // namespace kvrail::scheduler
