// GPU test of the fabric kernels (runs on the lent GPU machine, not in CI),
// through the daemon's own code (daemon/fabric/tile_copy.h GpuTileKernels):
// (up to 4 tiles in flight: kernels launched into 4 slots before any command is
// popped, the slot checked once its command appears; scatters polled by ticket in random order.)
// - sender: PackAndPublish gathers each tile from GPU memory straight into a send slot (host
//   memory registered with CUDA, mapped, as the fabric's lanes register it) and the kernel writes
//   the tile's NicCommand into a CommandRing (mapped on first use); the slot must equal the host
//   pack (PackTileHost) byte for byte and the command popped by the consumer must be the one the
//   CPU path posts;
// - receiver: Unpack scatters each packed tile from a mapped receive slot into a poisoned GPU
//   destination; the whole destination must equal the host unpack (UnpackTileHost) byte for byte
//   (so nothing outside the transfer's elements was written);
// on random layouts (odd sizes, offsets, padded strides, bytes transfers, misaligned bases) and
// the named cases: a TP1->TP2 and a TP1->TP4 head split with HND<->NHD conversions and decode
// blocks of other sizes. Ends with a bandwidth print: kernel pack vs the copy-engine pack
// (PackTile) into the same mapped slots.
#include <sys/mman.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/fabric/command_ring.h"
#include "daemon/fabric/tile_copy.h"
#include "daemon/fabric/tile_pack.h"
#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/fabric_math.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/gpu/gpu_util.h"
#include "tests/gpu/pinned_staging.h"

namespace kvrail::fabric {
namespace {

namespace k = ::kvrail::kernels;
using planner::testing::RandomCase;
constexpr uint8_t kPoison = 0xAB;

bool HaveGpu() { return gpu_test::HaveGpus(1, gpu_test::DeviceCount()); }

using gpu_test::Staging;

int g_kernel_tiles = 0;

// The consumer's side of the ring: the next command, spinning until the kernel published it (a
// kernel is not waited for by PackAndPublish). Seeing the command must mean every
// byte of its slot is visible (the callers check the slot right after).
k::NicCommand PopWithin(CommandRing* ring, double seconds = 10) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    std::optional<k::NicCommand> cmd = ring->Pop();
    if (cmd.has_value()) return *cmd;
    // A plain test per round, not an assertion: Catch2 counts every assertion, and this loop
    // spins: a run of this test counted 875 million assertions before.
    if (std::chrono::steady_clock::now() >= until) FAIL("no command within " << seconds << " s");
  }
}

absl::Status WaitTicket(GpuTileKernels& kernels, uint64_t ticket, double seconds = 10) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    std::optional<absl::Status> done = kernels.Poll(ticket);
    if (done.has_value()) return *done;
    if (std::chrono::steady_clock::now() >= until) {
      return absl::DeadlineExceededError(
          absl::StrCat("ticket ", ticket, " not done within ", seconds, " s"));
    }
  }
}

// Runs case `c` through both kernels (GPU bases shifted by `misalign`).
void RunCase(const RandomCase& c, std::mt19937_64& rng, uint32_t misalign) {
  INFO(c.ToString() << " misalign " << misalign);
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  INFO(plan->Describe());
  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  uint8_t* src_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(src.size() + 16));
  gpu_test::CopyToDevice(src_dev + misalign, src.data(), src.size());
  uint8_t* dst_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(c.dst.size_bytes + 16));
  gpu_test::Memset(dst_dev, kPoison, c.dst.size_bytes + 16);
  std::vector<uint8_t> want_dst(c.dst.size_bytes, kPoison);

  uint64_t max_tile = 0;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t)
    max_tile = std::max(max_tile, TileBytes(*plan, t));
  Staging slots(4 * (max_tile + 64));
  auto ring = CommandRing::Create(8);
  REQUIRE(ring.ok());
  std::string why_src, why_dst;
  auto sender = GpuTileKernels::ForSource(*plan, RegionSide{true, 0, src_dev + misalign},
                                          /*digest=*/false, /*kernels=*/true, &why_src);
  auto receiver = GpuTileKernels::ForDestination(*plan, RegionSide{true, 0, dst_dev + misalign},
                                                 /*kernels=*/true, &why_dst);
  REQUIRE(sender != nullptr);
  REQUIRE(receiver != nullptr);
  CHECK(why_src.find("kernel") != std::string::npos);
  // Several tiles in flight: up to 4 kernels launched into 4 slots before the
  // first command is popped; then their scatters launched together and polled in random order.
  std::vector<uint8_t> want;
  std::string mismatch;  // the first tile whose slot or command is wrong
  for (uint32_t first = 0; first < plan->num_tiles(); first += 4) {
    const uint32_t batch = std::min<uint32_t>(4, plan->num_tiles() - first);
    std::vector<k::NicCommand> engines(batch);
    for (uint32_t i = 0; i < batch; ++i) {
      uint8_t* staging = slots.data + i * (max_tile + 64);
      std::memset(staging, 0x5C, max_tile + 64);
      engines[i].peer = static_cast<uint16_t>(rng() % 16);
      engines[i].remote_handle = static_cast<uint16_t>(rng() % 65536);
      engines[i].transfer_tag = rng();
      REQUIRE(sender->PackAndPublish(first + i, i, staging, ring->get(), engines[i]).ok());
    }
    for (uint32_t i = 0; i < batch; ++i) {
      const uint32_t t = first + i;
      const uint64_t n = TileBytes(*plan, t);
      const k::NicCommand cmd = PopWithin(ring->get());  // in launch order (one stream)
      const uint8_t* staging = slots.data + i * (max_tile + 64);
      want.assign(n, 0);
      PackTileHost(*plan, t, src.data(), want.data());
      // Compared per tile, asserted once per case (a Catch2 assertion per tile cost more than
      // the kernels): the first tile that differs names itself.
      if (mismatch.empty()) {
        if (std::memcmp(staging, want.data(), n) != 0) {
          mismatch = absl::StrCat("tile ", t, ": packed bytes differ");
        } else if (staging[n] != 0x5C) {
          mismatch = absl::StrCat("tile ", t, ": written past its end");
        } else if (cmd.opcode != kOpWriteTile || cmd.tile != t || cmd.slot != i || cmd.bytes != n ||
                   cmd.peer != engines[i].peer || cmd.remote_handle != engines[i].remote_handle ||
                   cmd.transfer_tag != engines[i].transfer_tag) {
          mismatch =
              absl::StrCat("tile ", t, ": command (opcode ", cmd.opcode, ", tile ", cmd.tile,
                           ", slot ", cmd.slot, ", bytes ", cmd.bytes, ") is not the tile's");
        }
      }
      UnpackTileHost(*plan, t, want.data(), want_dst.data());
    }
    CHECK_FALSE((*ring)->Pop().has_value());
    // The receiver's side: the packed tiles scattered from their slots, all in flight at once.
    std::vector<uint64_t> tickets(batch);
    for (uint32_t i = 0; i < batch; ++i) {
      absl::StatusOr<uint64_t> ticket =
          receiver->UnpackAsync(first + i, slots.data + i * (max_tile + 64));
      REQUIRE(ticket.ok());
      tickets[i] = *ticket;
    }
    std::vector<uint32_t> order(batch);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t i : order) REQUIRE(WaitTicket(*receiver, tickets[i]).ok());
  }
  INFO(mismatch);
  CHECK(mismatch.empty());
  CHECK(sender->fallback_tiles() == 0);
  CHECK(receiver->fallback_tiles() == 0);
  CHECK(sender->kernel_tiles() == plan->num_tiles());
  g_kernel_tiles += static_cast<int>(sender->kernel_tiles() + receiver->kernel_tiles());
  std::vector<uint8_t> got(c.dst.size_bytes + 16);
  gpu_test::CopyToHost(got.data(), dst_dev, got.size());
  for (uint32_t i = 0; i < misalign; ++i) REQUIRE(got[i] == kPoison);
  for (uint32_t i = 0; i < 16 - misalign; ++i)
    REQUIRE(got[misalign + c.dst.size_bytes + i] == kPoison);
  REQUIRE(std::memcmp(got.data() + misalign, want_dst.data(), want_dst.size()) == 0);
  sender.reset();
  receiver.reset();
  gpu_test::DeviceFree(src_dev);
  gpu_test::DeviceFree(dst_dev);
}

// A serving-shaped case: bf16, head_dim 128, `src_heads` heads on the source (NHD or HND,
// 16-token blocks), moving heads [head_begin, head_begin + dst_heads) into a `dst_heads`-head
// destination of `dst_tpb`-token blocks in `dst_order`.
RandomCase NamedCase(std::mt19937_64& rng, uint32_t src_heads, uint32_t dst_heads,
                     uint32_t head_begin, v1::LayoutOrder src_order, v1::LayoutOrder dst_order,
                     uint32_t dst_tpb, uint32_t src_blocks, uint32_t layers, uint64_t tile_bytes) {
  RandomCase c;
  c.src_layout.set_num_layers(layers);
  c.src_layout.set_num_parts(2);
  c.src_layout.set_num_blocks(src_blocks + 8);
  c.src_layout.set_tokens_per_block(16);
  c.src_layout.set_num_heads(src_heads);
  c.src_layout.set_head_dim(128);
  c.src_layout.set_dtype(v1::DTYPE_BF16);
  c.src_layout.set_order(src_order);
  c.dst_layout = c.src_layout;
  const uint32_t dst_blocks = (src_blocks * 16 + dst_tpb - 1) / dst_tpb;
  c.dst_layout.set_num_blocks(dst_blocks + 8);
  c.dst_layout.set_tokens_per_block(dst_tpb);
  c.dst_layout.set_num_heads(dst_heads);
  c.dst_layout.set_order(dst_order);
  const uint64_t src_size = uint64_t{layers} * 2 * (src_blocks + 8) * 16 * src_heads * 256;
  const uint64_t dst_size = uint64_t{layers} * 2 * (dst_blocks + 8) * dst_tpb * dst_heads * 256;
  auto s = planner::ResolveLayout(c.src_layout, src_size, "");
  auto d = planner::ResolveLayout(c.dst_layout, dst_size, "");
  REQUIRE(s.ok());
  REQUIRE(d.ok());
  c.src = planner::RegionView{src_size, false, true, *s};
  c.dst = planner::RegionView{dst_size, true, true, *d};
  std::vector<uint32_t> ids(src_blocks + 8);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (uint32_t i = 0; i < src_blocks; ++i) c.spec.mutable_src()->add_block_ids(ids[i]);
  std::vector<uint32_t> dids(dst_blocks + 8);
  std::iota(dids.begin(), dids.end(), 0);
  std::shuffle(dids.begin(), dids.end(), rng);
  for (uint32_t i = 0; i < dst_blocks; ++i) c.spec.mutable_dst()->add_block_ids(dids[i]);
  c.spec.mutable_src()->set_head_begin(head_begin);
  c.spec.set_num_heads(dst_heads);
  c.options.tile_bytes = tile_bytes;
  return c;
}

TEST_CASE("fabric kernels: random paged layouts, byte for byte") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(1919);
  for (int i = 0; i < 150; ++i) {
    RunCase(planner::testing::RandomPagedCase(rng), rng,
            static_cast<uint32_t>(rng() % 2) * (rng() % 16));
  }
}

TEST_CASE("fabric kernels: serving layouts and bytes transfers, byte for byte") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(1920);
  for (int i = 0; i < 40; ++i) RunCase(planner::testing::RandomServingCase(rng), rng, 0);
  for (int i = 0; i < 60; ++i) {
    RunCase(planner::testing::RandomBytesCase(rng, 1 << 20), rng,
            static_cast<uint32_t>(rng() % 16));
  }
}

TEST_CASE("fabric kernels: head splits with HND<->NHD conversions, byte for byte") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(1921);
  using O = v1::LayoutOrder;
  const O nhd = v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD, hnd = v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND;
  // TP1 -> TP2 (second half of 8 heads), NHD 16-token -> HND 32-token blocks.
  RunCase(NamedCase(rng, 8, 4, 4, nhd, hnd, 32, 40, 4, 1 << 20), rng, 0);
  // TP1 -> TP4 (heads 2-3 of 8), HND -> NHD 8-token blocks, 4 MiB tiles and odd ones.
  RunCase(NamedCase(rng, 8, 2, 2, hnd, nhd, 8, 64, 3, 4 << 20), rng, 0);
  RunCase(NamedCase(rng, 8, 2, 6, hnd, nhd, 8, 33, 2, 12288), rng, 0);
  // No split, HND -> NHD, equal blocks.
  RunCase(NamedCase(rng, 4, 4, 0, hnd, nhd, 16, 50, 2, 1 << 20), rng, 0);
  CHECK(g_kernel_tiles > 0);
}

// Kernel pack (PackAndPublish) vs the copy-engine pack (PackTile) into the same mapped slots: a
// TP1->TP2 HND conversion of `mib` MiB in 4 MiB tiles, one thread (the sender's pack loop).
TEST_CASE("fabric kernels: pack bandwidth into mapped slots", "[bandwidth]") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(1922);
  const RandomCase c = NamedCase(rng, 8, 4, 4, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD,
                                 v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND, 32, 512, 16, 4 << 20);
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  uint8_t* src_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(c.src.size_bytes));
  gpu_test::Memset(src_dev, 0x3C, c.src.size_bytes);
  Staging slots(4 * (4 << 20));
  auto ring = CommandRing::Create(64);
  uint8_t* dst_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(c.dst.size_bytes));
  REQUIRE(ring.ok());
  std::string why;
  auto sender = GpuTileKernels::ForSource(*plan, RegionSide{true, 0, src_dev}, false, true, &why);
  REQUIRE(sender != nullptr);
  auto receiver = GpuTileKernels::ForDestination(*plan, RegionSide{true, 0, dst_dev}, true, &why);
  REQUIRE(receiver != nullptr);
  const RegionSide side{true, 0, src_dev};
  using Clock = std::chrono::steady_clock;
  for (int pass = 0; pass < 3; ++pass) {
    for (int kernel = 1; kernel >= 0; --kernel) {
      const auto t0 = Clock::now();
      for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
        uint8_t* staging = slots.data + (t % 4) * (uint64_t{4} << 20);
        if (kernel) {
          // Up to 4 kernels in flight: a slot is reused once its command was popped.
          if (t >= 4) PopWithin(ring->get());
          REQUIRE(sender->PackAndPublish(t, t % 4, staging, ring->get(), k::NicCommand{}).ok());
          if (t + 1 == plan->num_tiles()) {
            for (uint32_t left = std::min<uint32_t>(4, plan->num_tiles()); left > 0; --left) {
              PopWithin(ring->get());
            }
          }
        } else {
          REQUIRE(PackTile(*plan, t, side, staging).ok());
        }
      }
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("fabric pack %s: %.1f MiB in %u tiles (%s): %.2f GB/s\n",
                  kernel ? "kernel+command" : "copy engines  ", plan->bytes_total() / 1048576.0,
                  plan->num_tiles(), plan->Describe().c_str(), plan->bytes_total() / s / 1e9);
    }
    // The receiver's scatter from the 4 mapped slots, up to 4 kernels in flight.
    const auto t0 = Clock::now();
    std::vector<uint64_t> tickets(4, 0);
    for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
      if (t >= 4) REQUIRE(WaitTicket(*receiver, tickets[t % 4]).ok());
      absl::StatusOr<uint64_t> ticket =
          receiver->UnpackAsync(t, slots.data + (t % 4) * (uint64_t{4} << 20));
      REQUIRE(ticket.ok());
      tickets[t % 4] = *ticket;
    }
    for (uint32_t t = plan->num_tiles() >= 4 ? plan->num_tiles() - 4 : 0; t < plan->num_tiles();
         ++t) {
      REQUIRE(WaitTicket(*receiver, tickets[t % 4]).ok());
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("fabric unpack kernel (4 in flight): %.1f MiB in %u tiles: %.2f GB/s\n",
                plan->bytes_total() / 1048576.0, plan->num_tiles(), plan->bytes_total() / s / 1e9);
  }
  receiver.reset();
  gpu_test::DeviceFree(dst_dev);
  sender.reset();
  gpu_test::DeviceFree(src_dev);
}

}  // namespace
}  // namespace kvrail::fabric
