// The immediate data of tile writes and credits: every field round-trips at its limits, and only
// credits carry bit 63 (how a proxy tells them from tile writes).
#include "daemon/fabric/imm_data.h"

#include "catch2/catch.hpp"

namespace kvrail::fabric {
namespace {

TEST_CASE("a tile write's immediate data round-trips and is not a credit") {
  const uint64_t d = TileImm(126, 0xffff, 255, 0xffffffffu);
  CHECK((d & kCreditBit) == 0);
  CHECK(ImmIndex(d) == 126);
  CHECK(ImmHandle(d) == 0xffff);
  CHECK(ImmSlot(d) == 255);
  CHECK(ImmTile(d) == 0xffffffffu);
  const uint64_t small = TileImm(0, 1, 0, 7);
  CHECK((small & kCreditBit) == 0);
  CHECK(ImmHandle(small) == 1);
  CHECK(ImmTile(small) == 7);
}

TEST_CASE("a credit's immediate data carries index, slot, tile and whether it was applied") {
  const uint64_t applied = CreditImm(5, 17, 123456, true);
  CHECK((applied & kCreditBit) != 0);
  CHECK((applied & kNotAppliedBit) == 0);
  CHECK(ImmIndex(applied) == 5);
  CHECK(ImmSlot(applied) == 17);
  CHECK(ImmTile(applied) == 123456);
  const uint64_t dropped = CreditImm(126, 255, 0, false);
  CHECK((dropped & kCreditBit) != 0);
  CHECK((dropped & kNotAppliedBit) != 0);
  CHECK(ImmIndex(dropped) == 126);
  CHECK(ImmSlot(dropped) == 255);
  CHECK(ImmTile(dropped) == 0);
}

}  // namespace
}  // namespace kvrail::fabric
