// The hierarchy fed the live lane load: the daemon gathers the tiles out per lane
// (the sender's load-aware lane figure) into a load per NIC (NicLoadOfLanes), the RelayStage
// feeds it to the pure decision (scheduler::ChooseSideRelay through PlanRelay), and a region's
// GPU whose near NIC is loaded relays through the NVLink neighbour whose NIC is idle once the
// direct path is slower by more than the margin (20%, ties within 5%), and back when the load
// drains; the path reason names the loads. On the DGX H100 fixture (GPU i: mlx5_i, PIX; NV18
// between GPUs). This machine has no GPU: a relay the hierarchy wants is refused here ("no GPU1
// here: direct path", RelayNote::Kind::kSaid), which is what shows the decision; the plain
// direct path is quiet.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "daemon/fabric/relay.h"
#include "daemon/planner/testing/random_case.h"
#include "topology/testing/fixtures.h"

namespace kvrail::fabric {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> DgxLaneNics() {
  std::vector<std::string> nics;
  for (int i = 0; i < 8; ++i) nics.push_back("mlx5_" + std::to_string(i));
  return nics;
}

bool HasGpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

TEST_CASE("NicLoadOfLanes: lanes' tiles out add up per NIC, unmapped lanes count nowhere") {
  const auto node = scheduler::BuildRailNode(topology::testing::FixtureDesc("dgx_h100"));
  REQUIRE(node.ok());
  REQUIRE(node->nics.size() == 8);
  // Lanes 0 and 1 both on mlx5_3 (two endpoints on one link), lane 2 on mlx5_0, lane 3 unknown,
  // lane 4 on a NIC that is not a fabric NIC of this node, lane 5 beyond the load vector.
  const std::vector<std::string> lane_nics = {"mlx5_3", "mlx5_3", "mlx5_0", "", "eth9", "mlx5_1"};
  const NicLoad load = NicLoadOfLanes(*node, lane_nics, {5, 2, 1, 40, 40}, 4096);
  REQUIRE(load.tiles.size() == 8);
  REQUIRE(load.bytes.size() == 8);
  int rail3 = -1, rail0 = -1;
  for (size_t n = 0; n < node->nics.size(); ++n) {
    if (node->nics[n].name == "mlx5_3") rail3 = static_cast<int>(n);
    if (node->nics[n].name == "mlx5_0") rail0 = static_cast<int>(n);
  }
  REQUIRE(rail3 >= 0);
  REQUIRE(rail0 >= 0);
  uint32_t tiles = 0;
  for (uint32_t t : load.tiles) tiles += t;
  CHECK(tiles == 8);  // 5 + 2 + 1: the unknown and foreign lanes' 80 count nowhere
  CHECK(load.tiles[rail3] == 7);
  CHECK(load.bytes[rail3] == 7 * 4096);
  CHECK(load.tiles[rail0] == 1);
  CHECK(load.bytes[rail0] == 4096);
}

// One stage whose live load the test sets, like the sender's lanes.
struct Fixture {
  explicit Fixture(uint64_t slot_bytes) {
    options.slot_bytes = slot_bytes;
    options.topology =
        std::make_shared<const v1::TopologyDesc>(topology::testing::FixtureDesc("dgx_h100"));
    options.lane_nics = DgxLaneNics();
    lanes.assign(8, 0);
    stage = RelayStage::Create(RelaySide::kSend, options, ParseRelayConfig(nullptr),
                               [this] { return lanes; });
    // A 16 MiB transfer in 1 MiB tiles (slots of 1 MiB).
    c.spec.set_num_bytes(16 << 20);
    c.src = planner::RegionView{16 << 20, false, false, {}};
    c.dst = planner::RegionView{16 << 20, true, false, {}};
    c.options.tile_bytes = 1 << 20;
    auto made = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(made.ok());
    plan = std::make_unique<planner::Plan>(*std::move(made));
  }
  // The decision for a transfer from GPU0 (topology index 0, CUDA ordinal 0).
  RelayNote Decide() {
    RelayNote note;
    static uint8_t dummy[16];
    CHECK(stage->ForTransfer(*plan, RegionSide{true, 0, dummy}, 0, false, &note) == nullptr);
    return note;
  }
  FabricOptions options;
  std::vector<uint32_t> lanes;  // tiles out per lane (lane i on mlx5_i)
  std::unique_ptr<RelayStage> stage;
  planner::testing::RandomCase c;
  std::unique_ptr<planner::Plan> plan;
};

TEST_CASE("live lane load flips GPU0 from its NIC to GPU1's past the 20% margin, and back") {
  if (HasGpu()) {
    WARN("a GPU is present: this case reads the refusal of machines without one; skipped");
    return;
  }
  const uint64_t slot = 1 << 20;
  Fixture f(slot);
  const auto node = scheduler::BuildRailNode(*f.options.topology);
  REQUIRE(node.ok());
  const double bytes = static_cast<double>(f.plan->bytes_total());
  REQUIRE(bytes > 0);
  // The rule, from the fixture's rates: GPU0 direct drains its NIC's queue plus the transfer;
  // via GPU1 (idle NIC) the transfer plus the NVLink hop, ranked / (1 - 0.2), and the direct
  // path kept while within 5% of that.
  const double nic = node->gpus[0].gbps * 1e9;
  REQUIRE(nic > 0);
  REQUIRE(node->gpus[1].gbps * 1e9 == nic);
  const double nv = node->nvlink_gbps[0][1] * 1e9;
  REQUIRE(nv > 0);
  const double relay_bound = (bytes / nic + bytes / nv) / (1 - 0.2) * (1 + 0.05);
  auto relays = [&](uint32_t tiles) { return (tiles * double(slot) + bytes) / nic > relay_bound; };
  uint32_t flip = 0;
  while (!relays(flip)) ++flip;
  // The margin matters here: some loads make the direct path slower than the relay's own time
  // and still keep it.
  const double relay_time = bytes / nic + bytes / nv;
  uint32_t slower = 0;
  while ((slower * double(slot) + bytes) / nic <= relay_time) ++slower;
  REQUIRE(slower < flip);
  REQUIRE(flip >= 2);
  INFO("bytes " << bytes << ", direct slower from " << slower << " tiles, relay from " << flip);

  SECTION("idle: GPU0's own NIC, quiet") {
    const RelayNote note = f.Decide();
    CHECK(note.kind == RelayNote::Kind::kQuiet);
    CHECK(note.text == "relay: none (GPU0 (mlx5_0, PIX))");
  }
  SECTION("each load up to twice the flip: the rule's answer, from the lanes' live tiles") {
    for (uint32_t tiles = 0; tiles <= 2 * flip; ++tiles) {
      const double direct = (tiles * double(slot) + bytes) / nic;
      if (std::abs(direct - relay_bound) < 1e-12 * relay_bound) continue;  // on the edge
      f.lanes[0] = tiles;
      const RelayNote note = f.Decide();
      INFO(tiles << " tiles out on mlx5_0: " << note.text);
      if (relays(tiles)) {
        CHECK(note.kind == RelayNote::Kind::kSaid);
        CHECK(Has(note.text, "GPU0 -NV18-> GPU1 (mlx5_1, PIX): GPU0's NICs busy (mlx5_0 "));
        CHECK(Has(note.text, "but there is no GPU1 here (0 GPUs): direct path"));
      } else {
        CHECK(note.kind == RelayNote::Kind::kQuiet);
        CHECK(note.text == "relay: none (GPU0 (mlx5_0, PIX))");
      }
    }
  }
  SECTION("loaded past the margin, the reason names the loads; drained, back to direct") {
    f.lanes[0] = flip;
    RelayNote note = f.Decide();
    INFO(note.text);
    CHECK(note.kind == RelayNote::Kind::kSaid);
    char queued[64];
    std::snprintf(queued, sizeof queued, "mlx5_0 %.1f MiB queued",
                  static_cast<double>(flip) * slot / (1 << 20));
    CHECK(Has(note.text, std::string("GPU0's NICs busy (") + queued + ")"));
    CHECK(Has(note.text, "via GPU1 (mlx5_1 0.0 MiB queued)"));
    CHECK(Has(note.text, "tiles out: mlx5_0 " + std::to_string(flip) +
                             ", mlx5_1 0 (each counted as a 1.0 MiB slot)"));
    // GPU1's NIC loaded as much: the next neighbour with an idle NIC, GPU2.
    f.lanes[1] = flip;
    note = f.Decide();
    CHECK(Has(note.text, "GPU0 -NV18-> GPU2 (mlx5_2, PIX): GPU0's NICs busy"));
    CHECK(Has(note.text, "tiles out: mlx5_0 " + std::to_string(flip) + ", mlx5_2 0"));
    // Every NIC equally loaded: no neighbour is less busy, the direct path.
    f.lanes.assign(8, flip);
    CHECK(f.Decide().kind == RelayNote::Kind::kQuiet);
    // Drained back below the margin: the direct path again.
    f.lanes.assign(8, 0);
    f.lanes[0] = flip - 1;
    note = f.Decide();
    CHECK(note.kind == RelayNote::Kind::kQuiet);
    CHECK(note.text == "relay: none (GPU0 (mlx5_0, PIX))");
  }
}

TEST_CASE("a stage without a load source (the receiver's) and a forced mode ignore the load") {
  if (HasGpu()) {
    WARN("a GPU is present: this case reads the refusal of machines without one; skipped");
    return;
  }
  Fixture f(1 << 20);
  f.lanes[0] = 1000;
  REQUIRE(f.Decide().kind == RelayNote::Kind::kSaid);  // fed: a relay wanted
  auto blind = RelayStage::Create(RelaySide::kSend, f.options, ParseRelayConfig(nullptr));
  RelayNote note;
  static uint8_t dummy[16];
  CHECK(blind->ForTransfer(*f.plan, RegionSide{true, 0, dummy}, 0, false, &note) == nullptr);
  CHECK(note.kind == RelayNote::Kind::kQuiet);
  CHECK(note.text == "relay: none (GPU0 (mlx5_0, PIX))");
  auto off = RelayStage::Create(RelaySide::kSend, f.options, ParseRelayConfig("off"),
                                [&] { return f.lanes; });
  CHECK(off->ForTransfer(*f.plan, RegionSide{true, 0, dummy}, 0, false, &note) == nullptr);
  CHECK(note.text == "relay: none (fabric.relay off)");
}

}  // namespace
}  // namespace kvrail::fabric
