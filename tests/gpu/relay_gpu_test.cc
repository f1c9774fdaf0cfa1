// GPU test of the hierarchical path's relay hop (daemon/fabric/relay.h), through
// the daemon's own RelayStage (tag gpu: runs on a GPU machine, not in CI):
// - sender S -> R -> lane: the pack kernel on the source GPU S writes each tile into a relay slot
//   in GPU R's memory (peer access over NVLink when R != S), R's stream copies the slot into a
//   send slot in pinned host memory (registered with CUDA as the lanes register theirs: what the
//   NIC posts); the send slot must equal the host pack (PackTileHost) byte for byte with nothing
//   written past the tile;
// - receiver lane -> R' -> D: R''s stream copies the send slot (as the receive slot) into its
//   relay slot and the unpack kernel on D reads it and scatters into a poisoned destination; the
//   whole destination must equal the host unpack of the same tiles (poison kept everywhere else);
// on random layouts, bytes transfers and a serving-shaped head split with NHD->HND.
// Configurations: with one GPU, R == S == R' == D forced (KVRAIL_FABRIC_RELAY=gpu:0's config);
// with two GPUs and peer access, S=0 -> R=1 and R'=0 -> D=1 (both hops over NVLink), and the
// reverse; with two GPUs without peer access, the stage must refuse and name it.
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/cuda/cuda_util.h"
#include "daemon/fabric/relay.h"
#include "daemon/fabric/tile_copy.h"
#include "daemon/fabric/tile_pack.h"
#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/gpu/gpu_util.h"
#include "tests/gpu/pinned_staging.h"

namespace kvrail::fabric {
namespace {

using planner::testing::RandomCase;
constexpr uint8_t kPoison = 0xAB;

using gpu_test::Staging;

void* AllocOn(int device, size_t bytes) {
  REQUIRE(cudaSetDevice(device) == cudaSuccess);
  return gpu_test::DeviceAlloc(bytes);
}

struct Route {
  int s, r, r2, d;  // source GPU, sender's relay GPU, receiver's relay GPU, destination GPU
};

uint64_t g_relayed = 0;

void RunCase(const RandomCase& c, std::mt19937_64& rng, const Route& route) {
  INFO(c.ToString() << " S=" << route.s << " R=" << route.r << " R'=" << route.r2
                    << " D=" << route.d);
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  uint64_t max_tile = 0;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t)
    max_tile = std::max(max_tile, TileBytes(*plan, t));
  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  uint8_t* src_dev = static_cast<uint8_t*>(AllocOn(route.s, src.size()));
  gpu_test::CopyToDevice(src_dev, src.data(), src.size());
  uint8_t* dst_dev = static_cast<uint8_t*>(AllocOn(route.d, c.dst.size_bytes + 16));
  gpu_test::Memset(dst_dev, kPoison, c.dst.size_bytes + 16);
  gpu_test::Sync();
  std::vector<uint8_t> want_dst(c.dst.size_bytes + 16, kPoison);

  FabricOptions options;
  options.slot_bytes = max_tile;
  options.pack_threads = 2;
  auto sender = RelayStage::Create(RelaySide::kSend, options,
                                   ParseRelayConfig(("gpu:" + std::to_string(route.r)).c_str()));
  auto receiver = RelayStage::Create(RelaySide::kReceive, options,
                                     ParseRelayConfig(("gpu:" + std::to_string(route.r2)).c_str()));
  RelayNote why_send, why_recv;
  auto out = sender->ForTransfer(*plan, RegionSide{true, route.s, src_dev}, -1, false, &why_send);
  auto in = receiver->ForTransfer(*plan, RegionSide{true, route.d, dst_dev}, -1, false, &why_recv);
  INFO(why_send.text << "\n" << why_recv.text);
  REQUIRE(out != nullptr);
  REQUIRE(in != nullptr);
  CHECK(out->plan().kind == RelayKind::kGpu);
  CHECK(out->plan().relay_device == route.r);
  CHECK(out->plan().peer_access == (route.r != route.s));
  CHECK(in->plan().relay_device == route.r2);
  CHECK(why_send.text.find("pack kernel on GPU" + std::to_string(route.s) + " writes GPU" +
                           std::to_string(route.r) + "'s relay slot") != std::string::npos);

  Staging slot(max_tile + 64);
  std::vector<uint8_t> want;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    INFO("tile " << t);
    const uint64_t n = TileBytes(*plan, t);
    std::memset(slot.data, 0x5C, max_tile + 64);
    REQUIRE(out->Pack(t, slot.data).ok());
    want.assign(n, 0);
    PackTileHost(*plan, t, src.data(), want.data());
    REQUIRE(std::memcmp(slot.data, want.data(), n) == 0);
    REQUIRE(slot.data[n] == 0x5C);  // nothing past the tile
    REQUIRE(in->Unpack(t, slot.data).ok());
    UnpackTileHost(*plan, t, want.data(), want_dst.data());
  }
  CHECK(sender->relayed_tiles() == plan->num_tiles());
  CHECK(receiver->relayed_tiles() == plan->num_tiles());
  g_relayed += sender->relayed_tiles();
  std::vector<uint8_t> got(c.dst.size_bytes + 16);
  REQUIRE(cudaSetDevice(route.d) == cudaSuccess);
  gpu_test::CopyToHost(got.data(), dst_dev, got.size());
  REQUIRE(std::memcmp(got.data(), want_dst.data(), got.size()) == 0);  // poison kept past it too
  out.reset();
  in.reset();
  sender.reset();
  receiver.reset();
  gpu_test::DeviceFree(dst_dev);
  REQUIRE(cudaSetDevice(route.s) == cudaSuccess);
  gpu_test::DeviceFree(src_dev);
}

// bf16, head_dim 128, 16-token NHD blocks with 8 heads -> 32-token HND blocks with 4 heads.
RandomCase ServingCase() {
  std::mt19937_64 rng(77);
  RandomCase c = planner::testing::RandomServingCase(rng);
  return c;
}

void RunAll(const Route& route) {
  std::mt19937_64 rng(1800 + route.s * 10 + route.r);
  for (int i = 0; i < 40; ++i) RunCase(planner::testing::RandomPagedCase(rng), rng, route);
  for (int i = 0; i < 10; ++i) RunCase(planner::testing::RandomBytesCase(rng), rng, route);
  RunCase(ServingCase(), rng, route);
}

TEST_CASE("relay through the same GPU (R == S forced), byte for byte with poisoned destinations") {
  if (!gpu_test::HaveGpus(1, gpu_test::DeviceCount())) return;
  RunAll(Route{0, 0, 0, 0});
  WARN("relay_gpu_test: R == S on GPU0 (" << gpu_test::DeviceName(0) << "): " << g_relayed
                                          << " tiles relayed, byte for byte");
}

TEST_CASE("two GPUs: S -> R over NVLink -> send slot, receive slot -> R' -> D over NVLink") {
  if (!gpu_test::HaveGpus(2, gpu_test::DeviceCount())) return;
  if (!cuda::CanAccessPeer(0, 1) || !cuda::CanAccessPeer(1, 0)) {
    // The stage must refuse the relay and name it (the transfer keeps the direct path).
    FabricOptions options;
    options.slot_bytes = 1 << 20;
    auto stage = RelayStage::Create(RelaySide::kSend, options, ParseRelayConfig("gpu:1"));
    std::mt19937_64 rng(5);
    RandomCase c = planner::testing::RandomBytesCase(rng);
    auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    RelayNote why;
    void* src = AllocOn(0, 1 << 16);
    CHECK(stage->ForTransfer(*plan, RegionSide{true, 0, static_cast<uint8_t*>(src)}, -1, false,
                             &why) == nullptr);
    CHECK(why.text.find("no peer access to GPU1: direct path") != std::string::npos);
    gpu_test::DeviceFree(src);
    WARN("GPU0 and GPU1 have no peer access: relay refused as it should be: " << why.text);
    return;
  }
  const uint64_t before = g_relayed;
  RunAll(Route{0, 1, 0, 1});
  RunAll(Route{1, 0, 1, 0});
  WARN("relay_gpu_test: GPU0 -> GPU1 relay -> slot -> GPU0 relay -> GPU1 and the reverse: "
       << g_relayed - before << " tiles relayed, byte for byte");
}

}  // namespace
}  // namespace kvrail::fabric
