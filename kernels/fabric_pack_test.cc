// The fabric kernels' launch checks, which run before anything reaches the GPU (CI, no GPU): a
// tile outside the plan, a null slot, a published pack without its arrival word or epoch, and a
// plan never uploaded are refused with INVALID_ARGUMENT; nothing is launched.
#include "kernels/fabric_pack.h"

#include <catch2/catch.hpp>

namespace kvrail::kernels {
namespace {

TEST_CASE("fabric kernel launches outside the plan or without a slot are refused") {
  PlanHeader header{};  // never dereferenced: the checks come first
  DevicePlan plan;
  plan.header = &header;
  plan.num_tiles = 3;
  plan.access_bytes = 16;
  uint8_t slot[64];
  uint32_t arrivals = 0;
  FabricPackTile t;
  t.tile = 3;  // one past the last tile
  t.bytes = 64;
  t.staging = slot;
  CHECK(LaunchFabricPack(plan, t, &arrivals, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(LaunchFabricUnpack(plan, 3, 64, slot, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  t.tile = 2;
  t.staging = nullptr;
  CHECK(LaunchFabricPack(plan, t, &arrivals, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(LaunchFabricUnpack(plan, 2, 64, nullptr, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  // A command to publish needs the tile's arrival word and a lap (epoch 0 is "empty").
  t.staging = slot;
  NicCommand ring_slot{};
  t.ring_slot = &ring_slot;
  t.epoch = 1;
  CHECK(LaunchFabricPack(plan, t, nullptr, nullptr).code() == absl::StatusCode::kInvalidArgument);
  t.epoch = 0;
  CHECK(LaunchFabricPack(plan, t, &arrivals, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ring_slot.epoch == 0);  // nothing written
  DevicePlan none;
  CHECK(LaunchFabricUnpack(none, 0, 64, slot, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("fabric kernel unit width and grid") {
  DevicePlan plan;
  plan.access_bytes = 16;
  alignas(16) uint8_t buffer[64];
  CHECK(FabricAccessBytes(plan, buffer) == 16);
  CHECK(FabricAccessBytes(plan, buffer + 4) == 4);
  CHECK(FabricAccessBytes(plan, buffer + 1) == 1);
  plan.access_bytes = 2;
  CHECK(FabricAccessBytes(plan, buffer) == 2);
  CHECK(FabricCtasFor(1, 16) == 1);
  CHECK(FabricCtasFor(64 << 10, 16) == 1);
  CHECK(FabricCtasFor((64 << 10) + 1, 16) == 2);
  CHECK(FabricCtasFor(4 << 20, 16) == 32);  // capped
  CHECK(FabricCtasFor(4 << 10, 1) == 1);
}

}  // namespace
}  // namespace kvrail::kernels
