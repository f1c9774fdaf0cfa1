// spec.digest on the fabric's tile path, host regions (CI has no GPU): PackTileWithDigest packs
// what PackTile packs and puts the digest after the bytes; after UnpackTile the destination read
// back (DestinationTileDigest) gives the same digest, and a changed destination byte changes it.
// Also the fabric kernels' per-transfer choice and its reason
// (GpuTileKernels::ForSource/ForDestination).
#include "daemon/fabric/tile_copy.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "daemon/fabric/tile_pack.h"
#include "daemon/planner/testing/random_case.h"

namespace kvrail::fabric {
namespace {

TEST_CASE("digest trailer: sent digest == destination read back; a changed byte is caught") {
  std::mt19937_64 rng(41);
  for (int n = 0; n < 150; ++n) {
    const planner::testing::RandomCase c = n % 3 == 0 ? planner::testing::RandomBytesCase(rng)
                                                      : planner::testing::RandomPagedCase(rng);
    INFO(c.ToString());
    auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    std::vector<uint8_t> src(c.src.size_bytes), dst(c.dst.size_bytes, 0xAB);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> scratch(1 << 20);
    for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
      const uint64_t n_bytes = TileBytes(*plan, t);
      std::vector<uint8_t> plain(n_bytes), slot(n_bytes + kDigestTrailerBytes, 0);
      PackTileHost(*plan, t, src.data(), plain.data());
      const absl::StatusOr<uint64_t> sent =
          PackTileWithDigest(*plan, t, RegionSide{false, -1, src.data()}, slot.data());
      REQUIRE(sent.ok());
      REQUIRE(std::equal(plain.begin(), plain.end(), slot.begin()));
      REQUIRE(TrailerDigest(*plan, t, slot.data()) == *sent);
      REQUIRE(UnpackTile(*plan, t, slot.data(), RegionSide{false, -1, dst.data()}).ok());
      const absl::StatusOr<uint64_t> landed =
          DestinationTileDigest(*plan, t, RegionSide{false, -1, dst.data()}, scratch.data());
      REQUIRE(landed.ok());
      REQUIRE(*landed == *sent);
    }
    // One destination byte of a random tile changed: its read-back digest differs.
    const uint32_t t = static_cast<uint32_t>(rng() % plan->num_tiles());
    std::vector<planner::CopyRun> runs;
    planner::ForEachTileRun(*plan, t, [&](const planner::CopyRun& r) { runs.push_back(r); });
    const planner::CopyRun& r = runs[rng() % runs.size()];
    const uint64_t before =
        *DestinationTileDigest(*plan, t, RegionSide{false, -1, dst.data()}, scratch.data());
    planner::HostAddress(plan->header().dst, dst.data(), r.dst)[rng() % r.bytes] ^= 0x80;
    const RegionSide dst_side{false, -1, dst.data()};
    CHECK(*DestinationTileDigest(*plan, t, dst_side, scratch.data()) != before);
  }
}

}  // namespace
}  // namespace kvrail::fabric

namespace kvrail::fabric {
namespace {

// The fabric kernels' per-transfer choice: made without touching CUDA, so CI
// checks which path each kind of side gets and the reason the transfer's path_reason shows.
TEST_CASE("fabric kernels are chosen per transfer, with the reason") {
  std::mt19937_64 rng(42);
  const planner::testing::RandomCase c = planner::testing::RandomPagedCase(rng);
  auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  uint8_t byte = 0;
  std::string why;
  // A GPU source: the kernel, which packs into the mapped slot and writes the command ring.
  CHECK(GpuTileKernels::ForSource(*plan, RegionSide{true, 3, &byte}, false, true, &why) != nullptr);
  CHECK(why ==
        "fabric pack: GPU3 kernel gathers into the mapped send slot and writes the command "
        "ring (a kernel per free slot in flight)");
  // spec.digest: the copy engines (the packed slot is hashed on the host).
  CHECK(GpuTileKernels::ForSource(*plan, RegionSide{true, 0, &byte}, true, true, &why) == nullptr);
  CHECK(why.find("copy engines") != std::string::npos);
  CHECK(why.find("spec.digest") != std::string::npos);
  // Host regions: the CPU.
  CHECK(GpuTileKernels::ForSource(*plan, RegionSide{false, -1, &byte}, false, true, &why) ==
        nullptr);
  CHECK(why == "fabric pack: host region, packed by the CPU");
  CHECK(GpuTileKernels::ForDestination(*plan, RegionSide{true, 1, &byte}, true, &why) != nullptr);
  CHECK(why ==
        "fabric unpack: GPU1 kernel scatters from the mapped receive slot (several in "
        "flight, each slot credited when its kernel ends)");
  CHECK(GpuTileKernels::ForDestination(*plan, RegionSide{false, -1, &byte}, true, &why) == nullptr);
  CHECK(why == "fabric unpack: host region, by the CPU");
  // fabric.gpu_pack copy: GPU regions stay on the copy engines, both sides.
  CHECK(GpuTileKernels::ForSource(*plan, RegionSide{true, 3, &byte}, false, false, &why) ==
        nullptr);
  CHECK(why == "fabric pack: copy engines (fabric.gpu_pack copy)");
  CHECK(GpuTileKernels::ForDestination(*plan, RegionSide{true, 1, &byte}, false, &why) == nullptr);
  CHECK(why == "fabric unpack: copy engines (fabric.gpu_pack copy)");
}

}  // namespace
}  // namespace kvrail::fabric
