// Rail-aware and hierarchical routing on fixtures of real machines: DGX H100 (8 CX7, one per
// GPU), p5.48xlarge (32 EFA, four per GPU), an 8-GPU PCIe box with one NIC; NICs and rails per
// GPU, balance across rails, relays when a GPU has no near NIC or its NICs are busier, errors.
#include "daemon/scheduler/rails.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "topology/testing/fixtures.h"
#include "topology/topology.h"

namespace kvrail::scheduler {
namespace {

using topology::testing::WithoutNic;
v1::TopologyDesc Desc(const std::string& name) { return topology::testing::FixtureDesc(name); }

RailNode Node(const v1::TopologyDesc& desc) {
  auto node = BuildRailNode(desc);
  INFO(node.status().ToString());
  REQUIRE(node.ok());
  return *node;
}

RailNode Node(const std::string& name) { return Node(Desc(name)); }

RailRoute Route(const RailNode& a, int ga, const RailNode& b, int gb, const RailLoad& load = {},
                RailOptions options = {}) {
  auto r = ChooseRailRoute(a, ga, b, gb, load, options);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("DGX H100: GPU i leaves on mlx5_i, rail i, and lands on the peer's mlx5_i") {
  RailNode dgx = Node("dgx_h100");
  REQUIRE(dgx.nics.size() == 8);
  for (int g = 0; g < 8; ++g) {
    RailRoute r = Route(dgx, g, dgx, g);
    CHECK(r.path == v1::PATH_FABRIC);
    REQUIRE(r.lanes.size() == 1);
    CHECK(r.lanes[0].rail == g);
    CHECK(r.lanes[0].src_name == "mlx5_" + std::to_string(g));
    CHECK(r.lanes[0].dst_name == "mlx5_" + std::to_string(g));
    CHECK(r.lanes[0].share == Approx(1.0));
    CHECK(r.lanes[0].gbps == Approx(50.0));
    CHECK(r.src_tier == NicTier::kSwitch);
    CHECK(r.src_exit_gpu == g);
    CHECK(r.dst_entry_gpu == g);
  }
  CHECK(Route(dgx, 3, dgx, 3).reason == "GPU3 -> mlx5_3 (PIX) rail 3 -> peer mlx5_3 (PIX) GPU3");
}

TEST_CASE("DGX H100: to another rail's GPU, NVLink first to the GPU on the destination's rail") {
  RailNode dgx = Node("dgx_h100");
  RailRoute r = Route(dgx, 3, dgx, 5);
  CHECK(r.path == v1::PATH_HIERARCHICAL);
  CHECK(r.src_exit_gpu == 5);  // sender-side relay (PXN) before receiver-side
  CHECK(r.dst_entry_gpu == 5);
  REQUIRE(r.lanes.size() == 1);
  CHECK(r.lanes[0].rail == 5);
  CHECK(!r.cross_rail);
  CHECK(r.reason ==
        "GPU3 -NV18-> GPU5 -> mlx5_5 (PIX) rail 5 -> peer mlx5_5 (PIX) GPU5: no rail shared by "
        "GPU3's and peer GPU5's NICs; stays on rail 5");

  SECTION("without relays: cross-rail through the spine") {
    RailOptions options;
    options.hierarchical = false;
    RailRoute c = Route(dgx, 3, dgx, 5, {}, options);
    CHECK(c.path == v1::PATH_FABRIC);
    CHECK(c.cross_rail);
    REQUIRE(c.lanes.size() == 1);
    CHECK(c.lanes[0].rail == -1);
    CHECK(c.lanes[0].src_name == "mlx5_3");
    CHECK(c.lanes[0].dst_name == "mlx5_5");
    CHECK(Has(c.reason, "cross-rail"));
  }
  SECTION("neither relays nor cross-rail: no route, the error says why") {
    RailOptions options;
    options.hierarchical = false;
    options.cross_rail = false;
    auto c = ChooseRailRoute(dgx, 3, dgx, 5, {}, options);
    REQUIRE(!c.ok());
    CHECK(c.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Has(std::string(c.status().message()), "no shared rail"));
  }
  SECTION("the sender-side relay's NIC is busy: relay on the receiver instead") {
    RailLoad load;
    load.src_nics.assign(8, 0);
    load.src_nics[5] = uint64_t{4} << 30;  // 4 GiB queued on mlx5_5 (rail 5)
    RailOptions options;
    options.bytes = 64 << 20;
    RailRoute h = Route(dgx, 3, dgx, 5, load, options);
    CHECK(h.path == v1::PATH_HIERARCHICAL);
    CHECK(h.src_exit_gpu == 3);
    CHECK(h.dst_entry_gpu == 3);
    CHECK(h.reason ==
          "GPU3 -> mlx5_3 (PIX) rail 3 -> peer mlx5_3 (PIX) GPU3 -NV18-> GPU5: no rail shared by "
          "GPU3's and peer GPU5's NICs; stays on rail 3");
  }
}

TEST_CASE("p5.48xlarge: four EFA per GPU, four lanes on four rails, equal shares") {
  RailNode p5 = Node("p5_48xlarge");
  REQUIRE(p5.nics.size() == 32);
  for (int g = 0; g < 8; ++g) {
    RailRoute r = Route(p5, g, p5, g);
    CHECK(r.path == v1::PATH_FABRIC);
    REQUIRE(r.lanes.size() == 4);
    for (int k = 0; k < 4; ++k) {
      CHECK(r.lanes[k].rail == 4 * g + k);
      CHECK(r.lanes[k].src_name == r.lanes[k].dst_name);
      CHECK(r.lanes[k].share == Approx(0.25));
      CHECK(r.lanes[k].gbps == Approx(12.5));
    }
    CHECK(r.gbps == Approx(50.0));
  }
  CHECK(Route(p5, 0, p5, 0).reason ==
        "GPU0 -> rdmap19s0,rdmap20s0,rdmap21s0,rdmap22s0 (PIX) rails 0-3 -> peer "
        "rdmap19s0,rdmap20s0,rdmap21s0,rdmap22s0 (PIX) GPU0, striped over 4 lanes");
  // Striping 100 tiles of one transfer: 25 per lane, interleaved.
  std::vector<int> stripe = StripeTiles(Route(p5, 2, p5, 2), 100);
  std::map<int, int> count;
  for (int lane : stripe) ++count[lane];
  CHECK(count == std::map<int, int>{{0, 25}, {1, 25}, {2, 25}, {3, 25}});
  CHECK(stripe[0] != stripe[1]);
  // The incremental striper gives the same sequence.
  LaneStriper striper(Route(p5, 2, p5, 2));
  for (int k = 0; k < 100; ++k) CHECK(striper.Next() == stripe[k]);
}

TEST_CASE("p5.48xlarge: part of a GPU's EFA busy, the water-fill gives them less") {
  RailNode p5 = Node("p5_48xlarge");
  RailLoad load;
  load.src_nics.assign(32, 0);
  load.src_nics[0] = 8 << 20;  // 8 MiB queued on rdmap19s0
  RailOptions options;
  options.bytes = 32 << 20;
  RailRoute r = Route(p5, 0, p5, 0, load, options);
  CHECK(r.path == v1::PATH_FABRIC);
  REQUIRE(r.lanes.size() == 4);
  // Level T: (32 + 8) MiB over 4 lanes -> 10 MiB each; lane 0 takes 2, the others 10.
  CHECK(r.lanes[0].share == Approx(2.0 / 32));
  CHECK(r.lanes[1].share == Approx(10.0 / 32));
  CHECK(r.est_seconds == Approx(10.0 * (1 << 20) / 12.5e9));
  std::vector<int> stripe = StripeTiles(r, 32);
  CHECK(std::count(stripe.begin(), stripe.end(), 0) == 2);
}

TEST_CASE("balance: every GPU to every GPU of a peer, load fed back, keeps rails within 10%") {
  for (const std::string name : {"dgx_h100", "p5_48xlarge"}) {
    INFO(name);
    RailNode node = Node(name);
    RailLoad load;
    load.src_nics.assign(node.nics.size(), 0);
    load.dst_nics.assign(node.nics.size(), 0);
    RailOptions options;
    options.bytes = 64 << 20;
    int hierarchical = 0;
    for (int round = 0; round < 4; ++round) {
      for (int s = 0; s < 8; ++s) {
        for (int d = 0; d < 8; ++d) {
          RailRoute r = Route(node, s, node, d, load, options);
          hierarchical += r.path == v1::PATH_HIERARCHICAL;
          CHECK(!r.cross_rail);
          for (const RailLane& lane : r.lanes) {
            CHECK(lane.rail >= 0);
            load.src_nics[lane.src_nic] += static_cast<uint64_t>(lane.share * options.bytes);
            load.dst_nics[lane.dst_nic] += static_cast<uint64_t>(lane.share * options.bytes);
          }
        }
      }
    }
    CHECK(hierarchical == 4 * 56);  // every pair of different GPUs crosses NVLink once
    const auto [lo, hi] = std::minmax_element(load.src_nics.begin(), load.src_nics.end());
    CHECK(*lo > 0);
    CHECK(static_cast<double>(*hi) <= 1.1 * static_cast<double>(*lo));
    const auto [dlo, dhi] = std::minmax_element(load.dst_nics.begin(), load.dst_nics.end());
    CHECK(static_cast<double>(*dhi) <= 1.1 * static_cast<double>(*dlo));
  }
}

TEST_CASE("PCIe box with one NIC: every GPU goes through mlx5_0, the far ones say so") {
  RailNode box = Node("pcie_8gpu_1nic");
  REQUIRE(box.nics.size() == 1);  // eno1 (no RDMA) is not a fabric NIC
  CHECK(box.nics[0].name == "mlx5_0");
  for (int g = 0; g < 8; ++g) {
    RailRoute r = Route(box, g, box, g);
    CHECK(r.path == v1::PATH_FABRIC);  // no NVLink: nothing to relay over
    REQUIRE(r.lanes.size() == 1);
    CHECK(r.lanes[0].src_name == "mlx5_0");
    CHECK(r.lanes[0].rail == 0);
    CHECK(r.src_tier == (g < 2 ? NicTier::kSwitch : g < 4 ? NicTier::kNuma : NicTier::kFar));
  }
  CHECK(Route(box, 0, box, 0).reason == "GPU0 -> mlx5_0 (PIX) rail 0 -> peer mlx5_0 (PIX) GPU0");
  CHECK(Route(box, 2, box, 1).reason == "GPU2 -> mlx5_0 (PHB) rail 0 -> peer mlx5_0 (PIX) GPU1");
  CHECK(Route(box, 5, box, 0).reason ==
        "GPU5 -> mlx5_0 (SYS) rail 0 -> peer mlx5_0 (PIX) GPU0: no NIC near GPU5 (SYS: other "
        "socket) and no NVLink neighbour nearer one");
  // The one NIC busy: nowhere else to go, still the one lane.
  RailLoad load{{uint64_t{1} << 30}, {}};
  CHECK(Route(box, 0, box, 0, load).lanes.size() == 1);
}

TEST_CASE("a GPU without a NIC on its switch relays over NVLink (and symmetrically on the peer)") {
  // Both nodes lost mlx5_5 (rails stay aligned: identical nodes). GPU5's nearest NICs are now
  // NODE (other host bridges of socket 1).
  RailNode node = Node(WithoutNic(Desc("dgx_h100"), "mlx5_5"));
  REQUIRE(node.nics.size() == 7);
  CHECK(node.gpus[5].tier == NicTier::kNuma);
  RailRoute r = Route(node, 5, node, 5);
  CHECK(r.path == v1::PATH_HIERARCHICAL);
  CHECK(r.src_exit_gpu != 5);
  CHECK(r.dst_entry_gpu == r.src_exit_gpu);
  CHECK(r.src_tier == NicTier::kSwitch);
  CHECK(r.dst_tier == NicTier::kSwitch);
  CHECK(Has(r.reason, "GPU5 -NV18-> GPU"));
  CHECK(Has(r.reason, "-NV18-> GPU5: GPU5's nearest NIC is NODE (same NUMA node)"));
  CHECK(Has(r.reason, "peer GPU5's nearest NIC is NODE"));

  SECTION("without relays it takes the NUMA-local NICs and says nothing is wrong with rails") {
    RailOptions options;
    options.hierarchical = false;
    RailRoute d = Route(node, 5, node, 5, {}, options);
    CHECK(d.path == v1::PATH_FABRIC);
    CHECK(d.src_tier == NicTier::kNuma);
    CHECK(d.lanes.size() == 3);  // mlx5_4, mlx5_6, mlx5_7 tie at NODE
    CHECK(!d.cross_rail);
  }
  SECTION("the receiver alone lost its NIC: only the receiver relays") {
    RailNode full = Node("dgx_h100");
    // Sender full DGX, receiver without mlx5_5: rails differ past 4, so use GPU2 -> GPU2 on the
    // damaged receiver as the control (rail 2 both), and GPU4 -> GPU5 for the relay.
    RailRoute ok = Route(full, 2, node, 2);
    CHECK(ok.path == v1::PATH_FABRIC);
    RailRoute relay = Route(full, 4, node, 5);
    CHECK(relay.path == v1::PATH_HIERARCHICAL);
    CHECK(relay.src_exit_gpu == 4);
    CHECK(relay.dst_entry_gpu == 4);
    CHECK(relay.lanes[0].rail == 4);
    CHECK(Has(relay.reason, "peer GPU5's nearest NIC is NODE"));
  }
}

TEST_CASE("busier than a neighbour: relay only past the margin") {
  RailNode dgx = Node("dgx_h100");
  RailOptions options;
  options.bytes = 64 << 20;
  RailLoad load;
  load.src_nics.assign(8, 0);
  SECTION("a little queued: stay direct") {
    load.src_nics[0] = 8 << 20;  // 8 MiB queued vs 64 MiB to send: 12% slower, under 20%
    RailRoute r = Route(dgx, 0, dgx, 0, load, options);
    CHECK(r.path == v1::PATH_FABRIC);
    CHECK(r.src_exit_gpu == 0);
  }
  SECTION("a lot queued: over NVLink to a free NIC, and the peer brings it back") {
    load.src_nics[0] = 512 << 20;
    RailRoute r = Route(dgx, 0, dgx, 0, load, options);
    CHECK(r.path == v1::PATH_HIERARCHICAL);
    CHECK(r.src_exit_gpu != 0);
    CHECK(r.dst_entry_gpu == r.src_exit_gpu);
    CHECK(Has(r.reason, "direct NICs busy"));
    CHECK(r.est_seconds < 0.5 * (512.0 + 64) * (1 << 20) / 50e9);
  }
  SECTION("relays off: direct whatever the load") {
    load.src_nics[0] = 512 << 20;
    options.hierarchical = false;
    CHECK(Route(dgx, 0, dgx, 0, load, options).path == v1::PATH_FABRIC);
  }
  SECTION("the peer's NIC busy counts too") {
    load.dst_nics.assign(8, 0);
    load.dst_nics[0] = 512 << 20;
    RailRoute r = Route(dgx, 0, dgx, 0, load, options);
    CHECK(r.path == v1::PATH_HIERARCHICAL);
    CHECK(r.dst_entry_gpu != 0);
  }
}

TEST_CASE("errors name the field; nodes without NICs are refused") {
  RailNode dgx = Node("dgx_h100");
  auto r = ChooseRailRoute(dgx, 8, dgx, 0, {}, {});
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Has(std::string(r.status().message()), "src_gpu: GPU8"));
  r = ChooseRailRoute(dgx, 0, dgx, -1, {}, {});
  REQUIRE(!r.ok());
  CHECK(Has(std::string(r.status().message()), "dst_gpu: GPU-1"));

  v1::TopologyDesc bare = Desc("dgx_h100");
  bare.clear_nics();
  auto node = BuildRailNode(bare);
  REQUIRE(!node.ok());
  CHECK(node.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Has(std::string(node.status().message()), "'dgx-h100'"));

  auto cpu = BuildRailNode(Desc("cpu_only"));
  REQUIRE(cpu.ok());
  CHECK(!ChooseRailRoute(*cpu, 0, dgx, 0, {}, {}).ok());
}

// One side's half (the fabric's relay data path, daemon/fabric/relay.h): each daemon decides
// which of its GPUs carries its side's tiles from its own topology alone.
TEST_CASE(
    "ChooseSideRelay: a GPU without a near NIC relays to its NVLink neighbour, a GPU with "
    "one stays, busy NICs past the margin relay, a PCIe box never relays") {
  RailNode dgx = Node("dgx_h100");
  for (int g = 0; g < 8; ++g) {
    auto r = ChooseSideRelay(dgx, g, {}, {});
    REQUIRE(r.ok());
    CHECK(r->relay_gpu == g);
    CHECK(r->path == v1::PATH_FABRIC);
    CHECK(r->nvlinks == 0);
    CHECK(r->reason == absl::StrCat("GPU", g, " (mlx5_", g, ", PIX)"));
  }
  RailNode lost = Node(WithoutNic(Desc("dgx_h100"), "mlx5_5"));
  auto r = ChooseSideRelay(lost, 5, {}, {});
  REQUIRE(r.ok());
  CHECK(r->path == v1::PATH_HIERARCHICAL);
  CHECK(r->relay_gpu == 6);  // the next after GPU5 with a PIX NIC
  CHECK(r->tier == NicTier::kSwitch);
  CHECK(r->nvlinks == 18);
  CHECK(Has(r->reason, "GPU5 -NV18-> GPU6 ("));
  CHECK(Has(r->reason, "GPU5's nearest NIC is NODE (same NUMA node), GPU6's PIX"));
  // The two-node route agrees with each side's half.
  RailRoute both = Route(lost, 5, lost, 5);
  CHECK(both.src_exit_gpu == r->relay_gpu);
  CHECK(both.dst_entry_gpu == r->relay_gpu);
  {
    RailOptions off;
    off.hierarchical = false;
    auto d = ChooseSideRelay(lost, 5, {}, off);
    REQUIRE(d.ok());
    CHECK(d->relay_gpu == 5);
    CHECK(d->tier == NicTier::kNuma);
  }
  RailOptions options;
  options.bytes = 64 << 20;
  std::vector<uint64_t> load(8, 0);
  load[0] = 8 << 20;  // 12% slower than idle: under the 20% margin
  auto small = ChooseSideRelay(dgx, 0, load, options);
  REQUIRE(small.ok());
  CHECK(small->relay_gpu == 0);
  load[0] = 512 << 20;
  auto busy = ChooseSideRelay(dgx, 0, load, options);
  REQUIRE(busy.ok());
  CHECK(busy->path == v1::PATH_HIERARCHICAL);
  CHECK(busy->relay_gpu == 1);
  CHECK(Has(busy->reason, "GPU0's NICs busy"));
  // The PCIe box: no NVLink, GPU5's one NIC is on the other socket: stays, and says why.
  RailNode box = Node("pcie_8gpu_1nic");
  auto far = ChooseSideRelay(box, 5, {}, {});
  REQUIRE(far.ok());
  CHECK(far->relay_gpu == 5);
  CHECK(far->tier == NicTier::kFar);
  CHECK(far->reason == "GPU5 (mlx5_0, SYS): no NVLink neighbour nearer a NIC");
  CHECK(!ChooseSideRelay(dgx, 8, {}, {}).ok());
  CHECK(!ChooseSideRelay(dgx, -1, {}, {}).ok());
}

}  // namespace
}  // namespace kvrail::scheduler
