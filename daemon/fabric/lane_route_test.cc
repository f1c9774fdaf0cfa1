// Rail-aware lane selection on fixtures of real machines: DGX H100 (one CX7 per GPU), p5.48xlarge
// (four EFA per GPU), an 8-GPU PCIe box with one NIC; and every case where something is unknown
// and all lanes are kept (today's fabric behaviour).
#include "daemon/fabric/lane_route.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "daemon/directory/node_record.h"
#include "daemon/scheduler/rails.h"
#include "topology/topology.h"

namespace kvrail::fabric {
namespace {

v1::TopologyDesc Desc(const std::string& name) {
  auto desc = topology::LoadTopologyFile("topology/fixtures/" + name + ".textproto");
  INFO(desc.status().ToString());
  REQUIRE(desc.ok());
  return *desc;
}

// The peer's directory record, as the etcd directory publishes it.
v1::DirectoryNodeRecord Record(const v1::TopologyDesc& desc) {
  directory::NodeRecordInputs in;
  in.node_id = "peer";
  in.address = "10.0.0.2:7000";
  in.topology = desc;
  in.graph = topology::ComputeGraph(desc);
  return directory::BuildNodeRecord(in);
}

// One lane per RDMA NIC, in PCI bus-id order (FabricConfig.nics listed that way on both nodes).
std::vector<std::string> LaneNics(const v1::TopologyDesc& desc) {
  std::vector<const v1::Nic*> nics;
  for (const auto& nic : desc.nics()) {
    if (nic.rdma_capable()) nics.push_back(&nic);
  }
  std::sort(nics.begin(), nics.end(),
            [](const v1::Nic* a, const v1::Nic* b) { return a->pci_bus_id() < b->pci_bus_id(); });
  std::vector<std::string> out;
  for (const v1::Nic* nic : nics) out.push_back(nic->name());
  return out;
}

struct Case {
  v1::TopologyDesc desc;
  v1::DirectoryNodeRecord record;
  LaneRouteInput in;
};

Case Mirror(const std::string& fixture, int src_gpu, int dst_gpu) {
  Case c;
  c.desc = Desc(fixture);
  c.record = Record(c.desc);
  const std::vector<std::string> names = LaneNics(c.desc);
  c.in.lanes = static_cast<uint32_t>(names.size());
  c.in.local_lane_nics = names;
  c.in.peer_lane_nics = names;
  c.in.src_gpu = src_gpu;
  c.in.dst_gpu = dst_gpu;
  return c;
}

LaneRoute Choose(Case& c) {
  c.in.local = &c.desc;
  c.in.peer = &c.record;
  return ChooseLanes(c.in);
}

void RequireAll(const LaneRoute& r, uint32_t lanes, const std::string& why) {
  INFO(r.reason);
  CHECK(r.all);
  CHECK(r.lanes.size() == lanes);
  for (uint32_t l = 0; l < r.lanes.size(); ++l) CHECK(r.lanes[l] == l);
  CHECK(r.reason.find(why) != std::string::npos);
}

TEST_CASE("DGX H100: GPU3 to peer GPU3 uses only the mlx5_3 lane, rail 3") {
  Case c = Mirror("dgx_h100", 3, 3);
  REQUIRE(c.in.lanes >= 8);
  const LaneRoute r = Choose(c);
  INFO(r.reason);
  CHECK_FALSE(r.all);
  REQUIRE(r.lanes.size() == 1);
  CHECK(c.in.local_lane_nics[r.lanes[0]] == "mlx5_3");
  CHECK(r.shares == std::vector<double>{1.0});
  CHECK(r.reason.find("GPU3 -> mlx5_3 (PIX) rail 3 -> peer mlx5_3 GPU3") == 0);
  CHECK(r.reason.find("of " + std::to_string(c.in.lanes)) != std::string::npos);
}

TEST_CASE("DGX H100: every GPU i gets the one lane of mlx5_i") {
  for (int g = 0; g < 8; ++g) {
    Case c = Mirror("dgx_h100", g, g);
    const LaneRoute r = Choose(c);
    INFO(r.reason);
    REQUIRE(r.lanes.size() == 1);
    CHECK(c.in.local_lane_nics[r.lanes[0]] == "mlx5_" + std::to_string(g));
  }
}

TEST_CASE(
    "DGX H100: to another rail's GPU, the source's lane, and the reason says the relay is "
    "not built") {
  Case c = Mirror("dgx_h100", 3, 5);
  const LaneRoute r = Choose(c);
  INFO(r.reason);
  CHECK_FALSE(r.all);
  REQUIRE(r.lanes.size() == 1);
  CHECK(c.in.local_lane_nics[r.lanes[0]] == "mlx5_3");
  CHECK(r.reason.find("no lane lands near peer GPU5") != std::string::npos);
}

TEST_CASE("p5.48xlarge: GPU0 to peer GPU0 uses its four EFA lanes, equal shares") {
  Case c = Mirror("p5_48xlarge", 0, 0);
  REQUIRE(c.in.lanes == 32);
  const LaneRoute r = Choose(c);
  INFO(r.reason);
  CHECK_FALSE(r.all);
  CHECK(r.lanes == std::vector<uint32_t>{0, 1, 2, 3});
  REQUIRE(r.shares.size() == 4);
  for (double s : r.shares) CHECK(s == Approx(0.25));
  CHECK(r.reason.find("rails 0,1,2,3") != std::string::npos);
  CHECK(r.reason.find("lanes 0,1,2,3 of 32") != std::string::npos);
}

TEST_CASE("p5.48xlarge: GPU5 to peer GPU5 uses rails 20-23") {
  Case c = Mirror("p5_48xlarge", 5, 5);
  const LaneRoute r = Choose(c);
  INFO(r.reason);
  CHECK(r.lanes == std::vector<uint32_t>{20, 21, 22, 23});
}

TEST_CASE("lanes numbered differently on the peer: near on both sides, cross-rail") {
  Case c = Mirror("dgx_h100", 3, 3);
  // The peer's lane 3 lands on its mlx5_4, its lane 4 on mlx5_3 (swapped). To peer GPU3: lane 3
  // leaves near GPU3 but lands on mlx5_4, lane 4 lands near but leaves on mlx5_4: the source's
  // lane, said to land far.
  std::swap(c.in.peer_lane_nics[3], c.in.peer_lane_nics[4]);
  LaneRoute r = Choose(c);
  INFO(r.reason);
  REQUIRE(r.lanes.size() == 1);
  CHECK(r.lanes[0] == 3);
  CHECK(r.reason.find("no lane lands near peer GPU3") != std::string::npos);
  // Peer GPU4's NIC (mlx5_4) is now on lane 3: near both, but rail 3 here, rail 4 there.
  c.in.dst_gpu = 4;
  r = Choose(c);
  INFO(r.reason);
  REQUIRE(r.lanes.size() == 1);
  CHECK(r.lanes[0] == 3);
  CHECK(r.reason.find("cross-rail") != std::string::npos);
}

// The one router: on mirrored nodes the lanes the fabric picks are exactly the NIC pairs
// scheduler::ChooseRailRoute picks (without relays, which each side decides itself), with its
// shares.
TEST_CASE("the fabric's lanes are scheduler::ChooseRailRoute's NIC pairs") {
  for (const char* fixture : {"dgx_h100", "p5_48xlarge"}) {
    const v1::TopologyDesc desc = Desc(fixture);
    auto node = scheduler::BuildRailNode(desc);
    REQUIRE(node.ok());
    scheduler::RailOptions options;
    options.hierarchical = false;
    for (int src = 0; src < desc.gpus_size(); ++src) {
      for (int dst : {src, (src + 3) % desc.gpus_size()}) {
        Case c = Mirror(fixture, src, dst);
        const LaneRoute lanes = Choose(c);
        auto route = scheduler::ChooseRailRoute(*node, src, *node, dst, {}, options);
        INFO(fixture << " GPU" << src << " -> GPU" << dst << ": " << lanes.reason);
        REQUIRE(route.ok());
        if (route->cross_rail) continue;  // pairs in order there; the fabric keeps its lanes'
        std::vector<std::string> from_route, from_lanes;
        for (const auto& lane : route->lanes)
          from_route.push_back(lane.src_name + ">" + lane.dst_name);
        for (uint32_t l : lanes.lanes) {
          from_lanes.push_back(c.in.local_lane_nics[l] + ">" + c.in.peer_lane_nics[l]);
        }
        std::sort(from_route.begin(), from_route.end());
        std::sort(from_lanes.begin(), from_lanes.end());
        CHECK(from_lanes == from_route);
        double sum = 0;
        for (double share : lanes.shares) sum += share;
        CHECK(sum == Approx(1.0));
      }
    }
  }
}

TEST_CASE("PCIe box with one NIC: several lanes on it are all near, all kept") {
  Case c = Mirror("pcie_8gpu_1nic", 6, 2);
  REQUIRE(c.in.lanes == 1);
  // Two endpoints on the one link (striping over tcp).
  c.in.lanes = 2;
  c.in.local_lane_nics = {"mlx5_0", "mlx5_0"};
  c.in.peer_lane_nics = {"mlx5_0", "mlx5_0"};
  const LaneRoute r = Choose(c);
  INFO(r.reason);
  CHECK(r.all);
  CHECK(r.lanes == std::vector<uint32_t>{0, 1});
  CHECK(r.reason.find("GPU6 -> mlx5_0 (SYS) rail 0 -> peer mlx5_0 GPU2: lanes 0,1 of 2") == 0);
  // One lane: nothing to choose.
  c.in.lanes = 1;
  RequireAll(Choose(c), 1, "one lane");
}

TEST_CASE("anything unknown: all lanes, and why") {
  SECTION("host source") {
    Case c = Mirror("dgx_h100", -1, 3);
    RequireAll(Choose(c), c.in.lanes, "host source: all ");
  }
  SECTION("host destination") {
    Case c = Mirror("dgx_h100", 3, -1);
    RequireAll(Choose(c), c.in.lanes, "host destination");
  }
  SECTION("no local topology") {
    Case c = Mirror("dgx_h100", 3, 3);
    c.in.peer = &c.record;
    RequireAll(ChooseLanes(c.in), c.in.lanes, "no local topology");
  }
  SECTION("lanes not mapped (tcp on loopback)") {
    Case c = Mirror("dgx_h100", 3, 3);
    c.in.local_lane_nics = {"", "", "", "", "", "", "", ""};
    c.in.lanes = 8;
    RequireAll(Choose(c), 8, "lanes not mapped to topology NICs: all 8 lanes");
    c.in.local_lane_nics.clear();
    RequireAll(Choose(c), 8, "lanes not mapped to topology NICs");
  }
  SECTION("no lane on the GPU's nearest NICs") {
    Case c = Mirror("dgx_h100", 3, 3);
    c.in.lanes = 2;
    c.in.local_lane_nics = {"mlx5_0", "mlx5_1"};
    RequireAll(Choose(c), 2, "no lane on GPU3's nearest NICs (mlx5_3)");
  }
  SECTION("no directory record") {
    Case c = Mirror("dgx_h100", 3, 3);
    c.in.local = &c.desc;
    RequireAll(ChooseLanes(c.in), c.in.lanes, "no directory record for the peer");
  }
  SECTION("the peer's lanes not mapped to its NICs (names from its hello)") {
    Case c = Mirror("dgx_h100", 3, 3);
    for (uint32_t l = 0; l < c.in.lanes; ++l) {
      c.in.peer_lane_nics[l] = "nic" + std::to_string(l) + "@10.0.0.2";
    }
    RequireAll(Choose(c), c.in.lanes, "peer's lanes not mapped to its NICs");
  }
  SECTION("GPU not on either node") {
    Case c = Mirror("dgx_h100", 9, 3);
    RequireAll(Choose(c), c.in.lanes, "GPU9 not in the local topology");
    c.in.src_gpu = 3;
    c.in.dst_gpu = 8;
    RequireAll(Choose(c), c.in.lanes, "peer GPU8 not in its record");
  }
  SECTION("zero lanes") {
    LaneRouteInput in;
    const LaneRoute r = ChooseLanes(in);
    CHECK(r.lanes.empty());
  }
}

TEST_CASE("try order: the chosen lanes striped; when all of them failed, the other live lanes") {
  Case c = Mirror("p5_48xlarge", 0, 0);
  const LaneRoute r = Choose(c);
  REQUIRE(r.lanes == std::vector<uint32_t>{0, 1, 2, 3});
  std::vector<bool> usable(32, true);
  CHECK(LaneTryOrder(r, usable, 0) == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(LaneTryOrder(r, usable, 1) == std::vector<uint32_t>{1, 2, 3, 0});
  CHECK(LaneTryOrder(r, usable, 6) == std::vector<uint32_t>{2, 3, 0, 1});
  // Lane 1 failed (resting): skipped, the rest of the subset carries on.
  usable[1] = false;
  CHECK(LaneTryOrder(r, usable, 0) == std::vector<uint32_t>{0, 2, 3});
  // The whole subset failed: the other live lanes, never a failed one.
  usable[0] = usable[2] = usable[3] = false;
  usable[9] = false;
  const std::vector<uint32_t> fallback = LaneTryOrder(r, usable, 0);
  CHECK(fallback.size() == 27);
  CHECK(fallback.front() == 4);
  CHECK(std::find(fallback.begin(), fallback.end(), 9u) == fallback.end());
  // Nothing usable: nothing to try (the sender's "no fabric lane left").
  CHECK(LaneTryOrder(r, std::vector<bool>(32, false), 0).empty());
  // All lanes (nothing known): plain round robin over the usable ones, as the sender does today.
  const LaneRoute all = ChooseLanes(LaneRouteInput{4});
  CHECK(all.all);
  CHECK(LaneTryOrder(all, {true, false, true, true}, 1) == std::vector<uint32_t>{2, 3, 0});
}

TEST_CASE("a peer lane's name gives its NIC; unmapped lanes name none") {
  CHECK(NicOfLaneName("mlx5_3@10.0.0.3") == "mlx5_3");
  CHECK(NicOfLaneName("nic0@127.0.0.1") == "nic0");
  CHECK(NicOfLaneName("mlx5_3") == "mlx5_3");
  // An unmapped peer ("nic<i>@...") keeps all lanes.
  Case c = Mirror("dgx_h100", 3, 3);
  for (uint32_t l = 0; l < c.in.lanes; ++l) {
    c.in.peer_lane_nics[l] = NicOfLaneName("nic" + std::to_string(l) + "@10.0.0.2");
  }
  RequireAll(Choose(c), c.in.lanes, "peer's lanes not mapped to its NICs");
  // A mapped one ("<nic>@...") narrows.
  for (uint32_t l = 0; l < c.in.lanes; ++l) {
    c.in.peer_lane_nics[l] =
        NicOfLaneName(c.in.local_lane_nics[l] + "@10.0.1." + std::to_string(l));
  }
  CHECK(Choose(c).lanes.size() == 1);
}

TEST_CASE("a region's GPU: by UUID (either case), else by a CUDA ordinal only one GPU has") {
  v1::TopologyDesc desc;
  for (int i = 0; i < 3; ++i) {
    v1::Gpu* g = desc.add_gpus();
    g->set_index(i);
    g->set_uuid("GPU-0000000" + std::to_string(i) + "-aaaa-bbbb-cccc-dddddddddddd");
    g->set_cuda_ordinal(2 - i);  // the runtime numbers them the other way round
  }
  CHECK(GpuIndexOf(desc, "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", -1) == 1);
  CHECK(GpuIndexOf(desc, "gpu-00000002-AAAA-bbbb-cccc-dddddddddddd", 0) == 2);
  // A UUID decides: not found is unknown, whatever the ordinal.
  CHECK(GpuIndexOf(desc, "GPU-00000009-aaaa-bbbb-cccc-dddddddddddd", 0) == -1);
  CHECK(GpuIndexOf(desc, "", 0) == 2);
  CHECK(GpuIndexOf(desc, "", -1) == -1);
  // Two GPUs with one ordinal (a topology probed without CUDA): unknown, not a guess.
  desc.mutable_gpus(1)->set_cuda_ordinal(2);
  CHECK(GpuIndexOf(desc, "", 2) == -1);
}

TEST_CASE("a lane's interface names its topology NIC") {
  const v1::TopologyDesc desc = Desc("dgx_h100");
  CHECK(NicOfInterface(desc, "ibp28s0") == "mlx5_0");
  CHECK(NicOfInterface(desc, "mlx5_0") == "mlx5_0");
  CHECK(NicOfInterface(desc, "lo").empty());
  CHECK(NicOfInterface(desc, "").empty());
}

// ---- load-aware lane choice ----

TEST_CASE("p5: GPU0's four lanes listed least loaded first, the loads in the reason") {
  Case c = Mirror("p5_48xlarge", 0, 0);
  c.in.lane_load = std::vector<uint32_t>(c.in.lanes, 0);
  c.in.lane_load[0] = 5;
  c.in.lane_load[2] = 3;
  c.in.lane_load[9] = 40;  // another GPU's lane: not GPU0's, not listed
  const LaneRoute r = Choose(c);
  INFO(r.reason);
  CHECK_FALSE(r.all);
  CHECK(r.lanes == std::vector<uint32_t>{1, 3, 2, 0});
  REQUIRE(r.shares.size() == 4);
  CHECK(r.reason.find("by load, tiles out per lane now 1:0 3:0 2:3 0:5") != std::string::npos);
  // Without loads: ascending, as before.
  c.in.lane_load.clear();
  const LaneRoute plain = Choose(c);
  CHECK(plain.lanes == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(plain.reason.find("by load") == std::string::npos);
}

TEST_CASE("all lanes (tcp lanes not mapped to NICs): least loaded first, the loads in the reason") {
  Case c = Mirror("dgx_h100", 3, 3);
  c.in.local_lane_nics.assign(4, "");
  c.in.lanes = 4;
  c.in.lane_load = {2, 0, 1, 0};
  const LaneRoute r = Choose(c);
  INFO(r.reason);
  CHECK(r.all);
  CHECK(r.lanes == std::vector<uint32_t>{1, 3, 2, 0});
  CHECK(r.reason.find("lanes not mapped to topology NICs: all 4 lanes; by load, tiles out per "
                      "lane now 1:0 3:0 2:1 0:2: each tile to the least loaded") == 0);
}

TEST_CASE("try order by load: least loaded usable lane first, ties round robin, failover kept") {
  LaneRoute route;
  route.all = false;
  route.lanes = {0, 1, 2};
  const std::vector<bool> usable = {true, true, true, true};
  CHECK(LaneTryOrderByLoad(route, usable, {4, 1, 2, 0}, 0) == std::vector<uint32_t>{1, 2, 0});
  // Equal loads: LaneTryOrder's rotation.
  CHECK(LaneTryOrderByLoad(route, usable, {0, 0, 0, 0}, 1) == std::vector<uint32_t>{1, 2, 0});
  CHECK(LaneTryOrderByLoad(route, usable, {}, 2) == std::vector<uint32_t>{2, 0, 1});
  // A failed lane is skipped however idle; none of the route's usable: the others.
  CHECK(LaneTryOrderByLoad(route, {true, false, true, true}, {4, 0, 2, 0}, 0) ==
        std::vector<uint32_t>{2, 0});
  CHECK(LaneTryOrderByLoad(route, {false, false, false, true}, {0, 0, 0, 9}, 0) ==
        std::vector<uint32_t>{3});
}

// Tiles of concurrent transfers placed one by one (one packer thread taking the transfers' tiles
// in turn, as the sender's PackLoop does), each on the first lane of its try order; every lane
// drains `drain` tiles per round. Returns the tiles placed per (transfer, lane) and the largest
// backlog any lane had.
struct Placement {
  std::vector<std::vector<uint32_t>> per_transfer;  // [transfer][lane]
  std::vector<uint32_t> per_lane;
  uint32_t max_backlog = 0;
};
Placement Place(const std::vector<LaneRoute>& routes, uint32_t lanes, int rounds, uint32_t drain,
                bool by_load) {
  Placement p;
  p.per_transfer.assign(routes.size(), std::vector<uint32_t>(lanes, 0));
  p.per_lane.assign(lanes, 0);
  std::vector<uint32_t> out(lanes, 0);  // tiles out per lane
  const std::vector<bool> usable(lanes, true);
  uint32_t rr = 0;
  for (int round = 0; round < rounds; ++round) {
    for (size_t t = 0; t < routes.size(); ++t) {
      const std::vector<uint32_t> order = by_load ? LaneTryOrderByLoad(routes[t], usable, out, rr)
                                                  : LaneTryOrder(routes[t], usable, rr);
      ++rr;
      REQUIRE_FALSE(order.empty());
      const uint32_t l = order[0];
      ++out[l];
      ++p.per_transfer[t][l];
      ++p.per_lane[l];
      p.max_backlog = std::max(p.max_backlog, out[l]);
    }
    for (uint32_t& o : out) o -= std::min(o, drain);
  }
  return p;
}

TEST_CASE("two concurrent transfers from GPUs sharing NICs spread over them, by load") {
  // The one-NIC PCIe box with two lanes on its NIC (fabric.nics repeats the address): GPU0 and
  // GPU1 both sit on the NIC's switch, so both transfers get both lanes.
  Case c0 = Mirror("pcie_8gpu_1nic", 0, 0);
  REQUIRE(c0.in.lanes == 1);
  c0.in.lanes = 2;
  c0.in.local_lane_nics = {c0.in.local_lane_nics[0], c0.in.local_lane_nics[0]};
  c0.in.peer_lane_nics = {c0.in.peer_lane_nics[0], c0.in.peer_lane_nics[0]};
  Case c1 = c0;
  c1.in.src_gpu = 1;
  c1.in.dst_gpu = 1;
  const LaneRoute r0 = Choose(c0), r1 = Choose(c1);
  INFO(r0.reason << " | " << r1.reason);
  CHECK(r0.lanes == std::vector<uint32_t>{0, 1});
  CHECK(r1.lanes == std::vector<uint32_t>{0, 1});
  // Each lane drains one tile per round; two transfers offer two tiles per round.
  const Placement both = Place({r0, r1}, 2, 200, 1, /*by_load=*/true);
  CHECK(both.per_lane[0] == 200);
  CHECK(both.per_lane[1] == 200);
  CHECK(both.max_backlog <= 1);

  // A third transfer whose GPU has only lane 1 (its route is that lane) fills lane 1 (2 tiles per
  // round, lane 1 drains 2): the two sharing transfers (1 tile each per round) move to lane 0
  // instead of splitting evenly. Round robin (the old sender) kept sending every other tile to
  // lane 1: 3 tiles per round for 2 drained, and its backlog grew without bound.
  LaneRoute only1;
  only1.all = false;
  only1.lanes = {1};
  only1.shares = {1.0};
  const Placement load = Place({r0, r1, only1, only1}, 2, 300, 2, /*by_load=*/true);
  const Placement rr = Place({r0, r1, only1, only1}, 2, 300, 2, /*by_load=*/false);
  INFO("by load: lane0 " << load.per_lane[0] << " lane1 " << load.per_lane[1] << " backlog "
                         << load.max_backlog << "; round robin: lane0 " << rr.per_lane[0]
                         << " lane1 " << rr.per_lane[1] << " backlog " << rr.max_backlog);
  CHECK(load.per_lane[0] + load.per_lane[1] == 1200);
  CHECK(load.max_backlog <= 4);
  CHECK(std::max(load.per_lane[0], load.per_lane[1]) -
            std::min(load.per_lane[0], load.per_lane[1]) <=
        4);
  // The sharing transfers both use lane 0 most.
  for (int t = 0; t < 2; ++t) CHECK(load.per_transfer[t][0] > 10 * load.per_transfer[t][1]);
  // What round robin did: lane 1 overloaded, its backlog growing every round.
  CHECK(rr.per_lane[1] >= rr.per_lane[0] + 500);
  CHECK(rr.max_backlog > 100);
}

}  // namespace
}  // namespace kvrail::fabric
