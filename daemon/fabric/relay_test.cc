// The hierarchical path's relay hop (relay.h): the pure plan (which GPU, which slot, which
// stream, and why; the hierarchy's decision on the topology fixtures, forced relays, every case
// that keeps the direct path) and the host twin through RelayStage byte for byte on random
// layouts (pack through a relay slot into a send slot, unpack from a receive slot through a
// relay slot), with poisoned destinations. The GPU relay itself runs in
// //tests/gpu:relay_gpu_test (tag gpu).
#include "daemon/fabric/relay.h"

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/fabric/tile_pack.h"
#include "daemon/planner/testing/random_case.h"
#include "topology/testing/fixtures.h"
#include "topology/topology.h"

namespace kvrail::fabric {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

using topology::testing::WithoutNic;
v1::TopologyDesc Desc(const std::string& name) { return topology::testing::FixtureDesc(name); }

RelayInput GpuInput(const scheduler::RailNode* node, int gpu, RelaySide side = RelaySide::kSend) {
  RelayInput in;
  in.side = side;
  in.cuda = true;
  in.device = gpu;
  in.gpu_index = gpu;
  in.node = node;
  in.ordinal_of_index = {0, 1, 2, 3, 4, 5, 6, 7};
  in.devices = 8;
  in.can_access_peer = [](int a, int b) { return a != b; };
  in.slots = 2;
  in.slot_bytes = 4 << 20;
  in.bytes = 64 << 20;
  return in;
}

TEST_CASE("fabric.relay values") {
  CHECK(ParseRelayConfig(nullptr).mode == RelayMode::kAuto);
  CHECK(ParseRelayConfig("").mode == RelayMode::kAuto);
  CHECK(ParseRelayConfig("auto").mode == RelayMode::kAuto);
  CHECK(ParseRelayConfig("off").mode == RelayMode::kOff);
  CHECK(ParseRelayConfig("host").mode == RelayMode::kHost);
  const RelayConfig g = ParseRelayConfig("gpu:1");
  CHECK(g.mode == RelayMode::kGpu);
  CHECK(g.gpu == 1);
  CHECK(g.error.empty());
  for (const char* bad : {"gpu:", "gpu:x", "gpu:-1", "nvlink", "gpu:99999"}) {
    const RelayConfig c = ParseRelayConfig(bad);
    INFO(bad);
    CHECK(c.mode == RelayMode::kOff);
    CHECK(Has(c.error, "fabric.relay: "));
  }
}

TEST_CASE("auto: a GPU that lost its NIC relays through its NVLink neighbour, on either side") {
  const auto node = scheduler::BuildRailNode(WithoutNic(Desc("dgx_h100"), "mlx5_5"));
  REQUIRE(node.ok());
  const RelayPlan send = PlanRelay(GpuInput(&*node, 5));
  INFO(send.reason);
  CHECK(send.kind == RelayKind::kGpu);
  CHECK(send.region_device == 5);
  CHECK(send.relay_device == 6);
  CHECK(send.relay_gpu_index == 6);
  CHECK(send.peer_access);
  CHECK(send.kernel_device == 5);  // the pack kernel runs on S's stream
  CHECK(send.copy_device == 6);    // R's stream copies the relay slot to the send slot
  CHECK(send.slots == 2);
  CHECK(RelaySlotOffset(send, 1) == (4u << 20));
  CHECK(Has(send.reason,
            "relay (send): GPU5 -NV18-> GPU6 (mlx5_6, PIX): GPU5's nearest NIC is NODE"));
  CHECK(Has(send.reason, "pack kernel on GPU5 writes GPU6's relay slot (NVLink)"));
  const RelayPlan recv = PlanRelay(GpuInput(&*node, 5, RelaySide::kReceive));
  INFO(recv.reason);
  CHECK(recv.kind == RelayKind::kGpu);
  CHECK(recv.relay_device == 6);
  CHECK(recv.kernel_device == 5);  // the unpack kernel on D reads R's slot
  CHECK(recv.copy_device == 6);
  CHECK(Has(recv.reason, "unpack kernel on GPU5 reads it (NVLink)"));

  SECTION("CUDA ordinals differ from topology indexes: R is named by its ordinal") {
    RelayInput in = GpuInput(&*node, 3);
    in.gpu_index = 5;
    in.ordinal_of_index = {7, 6, 5, 4, 3, 2, 1, 0};  // index 6 is ordinal 1
    const RelayPlan p = PlanRelay(in);
    CHECK(p.kind == RelayKind::kGpu);
    CHECK(p.relay_device == 1);
    CHECK(p.relay_gpu_index == 6);
  }
  SECTION("no peer access: the direct path, saying why") {
    RelayInput in = GpuInput(&*node, 5);
    in.can_access_peer = [](int, int) { return false; };
    const RelayPlan p = PlanRelay(in);
    CHECK(p.kind == RelayKind::kNone);
    CHECK(Has(p.reason, "GPU5 has no peer access to GPU6: direct path"));
    CHECK(p.wanted);
    in.can_access_peer = nullptr;
    CHECK(PlanRelay(in).kind == RelayKind::kNone);
  }
  SECTION("the relay GPU is not visible to this daemon (CUDA_VISIBLE_DEVICES)") {
    RelayInput in = GpuInput(&*node, 5);
    in.ordinal_of_index[6] = -1;
    const RelayPlan p = PlanRelay(in);
    CHECK(p.kind == RelayKind::kNone);
    CHECK(Has(p.reason, "GPU6 is not visible to this daemon: direct path"));
    CHECK(p.wanted);
  }
}

TEST_CASE("auto: GPUs with their own NIC, busy NICs, a box without NVLink, unknowns") {
  const auto dgx = scheduler::BuildRailNode(Desc("dgx_h100"));
  REQUIRE(dgx.ok());
  for (int g = 0; g < 8; ++g) {
    const RelayPlan p = PlanRelay(GpuInput(&*dgx, g));
    CHECK(p.kind == RelayKind::kNone);
    CHECK(p.reason ==
          "relay: none (GPU" + std::to_string(g) + " (mlx5_" + std::to_string(g) + ", PIX))");
    CHECK(!p.wanted);
  }
  RelayInput busy = GpuInput(&*dgx, 0);
  busy.nic_load.assign(8, 0);
  busy.nic_load[0] = uint64_t{512} << 20;
  const RelayPlan b = PlanRelay(busy);
  CHECK(b.kind == RelayKind::kGpu);
  CHECK(b.relay_device == 1);
  CHECK(Has(b.reason, "GPU0's NICs busy"));

  const auto box = scheduler::BuildRailNode(Desc("pcie_8gpu_1nic"));
  REQUIRE(box.ok());
  const RelayPlan far = PlanRelay(GpuInput(&*box, 5));
  CHECK(far.kind == RelayKind::kNone);
  CHECK(Has(far.reason, "no NVLink neighbour nearer a NIC"));

  RelayInput unknown = GpuInput(nullptr, 0);
  CHECK(PlanRelay(unknown).reason == "relay: none (no local topology)");
  unknown = GpuInput(&*dgx, 0);
  unknown.gpu_index = -1;
  CHECK(PlanRelay(unknown).reason == "relay: none (GPU0 not in the local topology)");
  RelayInput host = GpuInput(&*dgx, 0);
  host.cuda = false;
  host.device = -1;
  CHECK(PlanRelay(host).reason == "relay: none (host region)");
  RelayInput digest = GpuInput(&*dgx, 0);
  digest.nic_load = busy.nic_load;
  digest.digest = true;
  CHECK(PlanRelay(digest).kind == RelayKind::kNone);
  CHECK(Has(PlanRelay(digest).reason, "spec.digest"));
}

TEST_CASE("forced relays (tests, the two-GPU run), host twin, off") {
  RelayInput in = GpuInput(nullptr, 0);
  in.config = ParseRelayConfig("gpu:1");
  RelayPlan p = PlanRelay(in);
  CHECK(p.kind == RelayKind::kGpu);
  CHECK(p.relay_device == 1);
  CHECK(p.relay_gpu_index == -1);
  CHECK(p.peer_access);
  CHECK(Has(p.reason, "GPU0 -> GPU1 (forced: fabric.relay gpu:1, test)"));
  // R == S on a one-GPU machine: no peer access needed, the slot is in the GPU's own memory.
  in.config = ParseRelayConfig("gpu:0");
  in.devices = 1;
  in.can_access_peer = nullptr;
  p = PlanRelay(in);
  CHECK(p.kind == RelayKind::kGpu);
  CHECK(p.relay_device == 0);
  CHECK(!p.peer_access);
  CHECK(Has(p.reason, "writes GPU0's relay slot (its own memory)"));
  // No such GPU.
  in.config = ParseRelayConfig("gpu:1");
  p = PlanRelay(in);
  CHECK(p.kind == RelayKind::kNone);
  CHECK(Has(p.reason, "no GPU1 here (1 GPUs): direct path"));
  CHECK(p.wanted);
  // A host region never takes a GPU relay; the host twin takes any region.
  in.cuda = false;
  in.device = -1;
  CHECK(PlanRelay(in).kind == RelayKind::kNone);
  in.config = ParseRelayConfig("host");
  p = PlanRelay(in);
  CHECK(p.kind == RelayKind::kHost);
  CHECK(p.relay_device == -1);
  CHECK(Has(p.reason, "host twin"));
  in.config = ParseRelayConfig("off");
  CHECK(PlanRelay(in).reason == "relay: none (fabric.relay off)");
  in.config = ParseRelayConfig("bogus");
  CHECK(Has(PlanRelay(in).reason, "not understood"));
}

// The host twin through the stage: sender's pack -> relay slot -> send slot; the receiver's
// receive slot -> relay slot -> destination; equals the reference copy, poison elsewhere kept.
void RunHostTwin(const planner::testing::RandomCase& c, std::mt19937_64& rng) {
  INFO(c.ToString());
  auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  uint64_t max_tile = 0;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t)
    max_tile = std::max(max_tile, TileBytes(*plan, t));
  FabricOptions options;
  options.slot_bytes = max_tile;
  options.pack_threads = 2;
  const RelayConfig host = ParseRelayConfig("host");
  auto sender = RelayStage::Create(RelaySide::kSend, options, host);
  auto receiver = RelayStage::Create(RelaySide::kReceive, options, host);
  std::vector<uint8_t> src(c.src.size_bytes), want(c.dst.size_bytes, 0xAB),
      got(c.dst.size_bytes, 0xAB);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  planner::testing::ReferenceCopy(c, src.data(), want.data());
  RelayNote why_send, why_recv;
  auto out = sender->ForTransfer(*plan, RegionSide{false, -1, src.data()}, -1, false, &why_send);
  auto in = receiver->ForTransfer(*plan, RegionSide{false, -1, got.data()}, -1, false, &why_recv);
  REQUIRE(out != nullptr);
  REQUIRE(in != nullptr);
  CHECK(Has(why_send.text, "host twin"));
  CHECK(Has(why_recv.text, "host twin"));
  CHECK(why_send.kind == RelayNote::Kind::kRelayed);
  // Two threads, as the packers: distinct tiles concurrently through the shared slot pool.
  auto run = [&](uint32_t first) {
    std::vector<uint8_t> wire(max_tile, 0x5A);
    for (uint32_t t = first; t < plan->num_tiles(); t += 2) {
      REQUIRE(out->Pack(t, wire.data()).ok());
      REQUIRE(in->Unpack(t, wire.data()).ok());
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  CHECK(got == want);
  CHECK(sender->relayed_tiles() == plan->num_tiles());
  CHECK(receiver->relayed_tiles() == plan->num_tiles());
  // A tile outside the plan never touches a slot.
  std::vector<uint8_t> wire(max_tile, 0);
  CHECK(!out->Pack(plan->num_tiles(), wire.data()).ok());
  CHECK(!in->Unpack(plan->num_tiles(), wire.data()).ok());
}

TEST_CASE("host twin: two-stage pack/unpack through relay slots equals the reference copy") {
  std::mt19937_64 rng(18);
  for (int i = 0; i < 60; ++i) RunHostTwin(planner::testing::RandomPagedCase(rng), rng);
  for (int i = 0; i < 20; ++i) RunHostTwin(planner::testing::RandomBytesCase(rng), rng);
  CHECK(ProcessRelayedTiles(RelaySide::kSend) > 0);
  CHECK(ProcessRelayedTiles(RelaySide::kReceive) == ProcessRelayedTiles(RelaySide::kSend));
}

TEST_CASE("a tile packed again (a lane failover's re-send) is counted once on each side") {
  std::mt19937_64 rng(7);
  planner::testing::RandomCase c;
  absl::StatusOr<planner::Plan> plan;
  do {  // a case of several tiles
    c = planner::testing::RandomPagedCase(rng);
    plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
  } while (plan->num_tiles() < 3);
  uint64_t max_tile = 0;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    max_tile = std::max(max_tile, TileBytes(*plan, t));
  }
  FabricOptions options;
  options.slot_bytes = max_tile;
  const RelayConfig host = ParseRelayConfig("host");
  auto sender = RelayStage::Create(RelaySide::kSend, options, host);
  auto receiver = RelayStage::Create(RelaySide::kReceive, options, host);
  std::vector<uint8_t> src(c.src.size_bytes, 0x11), dst(c.dst.size_bytes, 0);
  RelayNote note;
  auto out = sender->ForTransfer(*plan, RegionSide{false, -1, src.data()}, -1, false, &note);
  auto in = receiver->ForTransfer(*plan, RegionSide{false, -1, dst.data()}, -1, false, &note);
  REQUIRE(out != nullptr);
  REQUIRE(in != nullptr);
  const uint64_t sent_before = ProcessRelayedTiles(RelaySide::kSend);
  const uint64_t received_before = ProcessRelayedTiles(RelaySide::kReceive);
  std::vector<uint8_t> wire(max_tile, 0);
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    REQUIRE(out->Pack(t, wire.data()).ok());
    REQUIRE(in->Unpack(t, wire.data()).ok());
  }
  // Tile 0 re-sent (its lane failed before the credit): packed again, and landed again.
  REQUIRE(out->Pack(0, wire.data()).ok());
  REQUIRE(in->Unpack(0, wire.data()).ok());
  CHECK(sender->relayed_tiles() == plan->num_tiles());
  CHECK(receiver->relayed_tiles() == plan->num_tiles());
  CHECK(ProcessRelayedTiles(RelaySide::kSend) - sent_before == plan->num_tiles());
  CHECK(ProcessRelayedTiles(RelaySide::kReceive) - received_before == plan->num_tiles());
}

TEST_CASE("a GPU relay that cannot be made here keeps the direct path and says why") {
  // This build machine has no GPU (0 devices): a forced GPU relay of a "GPU region" is refused
  // by the plan; nothing is allocated or launched.
  FabricOptions options;
  options.slot_bytes = 1 << 20;
  auto stage = RelayStage::Create(RelaySide::kSend, options, ParseRelayConfig("gpu:0"));
  planner::testing::RandomCase c;
  std::mt19937_64 rng(3);
  c = planner::testing::RandomBytesCase(rng);
  auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  RelayNote why;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices > 0) {
    WARN("a GPU is present: the refusal case is for machines without one; skipped");
    return;
  }
  static uint8_t dummy[16];
  CHECK(stage->ForTransfer(*plan, RegionSide{true, 0, dummy}, -1, false, &why) == nullptr);
  CHECK(Has(why.text, "no GPU0 here (0 GPUs): direct path"));
  CHECK(why.kind == RelayNote::Kind::kSaid);
  CHECK(stage->ForTransfer(*plan, RegionSide{false, -1, dummy}, -1, false, &why) == nullptr);
  CHECK(why.text == "relay: none (host region)");
  CHECK(why.kind == RelayNote::Kind::kSaid);  // forced: said even when plain
  // Auto mode: a plain "none" is not said; a relay wanted but not made is.
  auto auto_stage = RelayStage::Create(RelaySide::kSend, options, ParseRelayConfig(nullptr));
  CHECK(auto_stage->ForTransfer(*plan, RegionSide{false, -1, dummy}, -1, false, &why) == nullptr);
  CHECK(why.text == "relay: none (host region)");
  CHECK(why.kind == RelayNote::Kind::kQuiet);
}

TEST_CASE("NoteRelay: a relay made replaces the path note, a said one is added, a quiet one not") {
  std::string why = "GPU kernel";
  NoteRelay(RelayNote{RelayNote::Kind::kQuiet, "relay: none (host region)"}, &why);
  CHECK(why == "GPU kernel");
  NoteRelay(RelayNote{RelayNote::Kind::kSaid, "relay: none (fabric.relay off)"}, &why);
  CHECK(why == "GPU kernel; relay: none (fabric.relay off)");
  // The rule reads the kind, not the words: a plain note that happens to say "direct path".
  why = "GPU kernel";
  NoteRelay(RelayNote{RelayNote::Kind::kQuiet, "relay: none (the direct path is nearer)"}, &why);
  CHECK(why == "GPU kernel");
  std::string empty;
  NoteRelay(RelayNote{RelayNote::Kind::kSaid, "relay: none (host region)"}, &empty);
  CHECK(empty == "relay: none (host region)");
  NoteRelay(RelayNote{RelayNote::Kind::kRelayed, "relay: host twin"}, &why);
  CHECK(why == "relay: host twin");
}

}  // namespace
}  // namespace kvrail::fabric
