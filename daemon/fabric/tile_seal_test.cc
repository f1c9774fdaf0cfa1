// The seal the receiver checks after every fabric tile (lanes.h TileSeal, SealRefusal): a tile is
// applied only when its seal carries the key of the registration of the peer its immediate data
// names (so another peer, which holds a different key and can write only its own range, cannot
// pass off bytes in its range as that peer's), names the arrival's handle and tile (so the named
// peer's real bytes cannot be applied as another tile or transfer), and is not consumed yet (so a
// replayed or spoofed completion cannot make a tile count twice or credit a slot twice).
#include <catch2/catch.hpp>
#include <string>

#include "daemon/fabric/imm_data.h"

namespace kvrail::fabric {
namespace {

TileSeal Seal(uint64_t key, uint64_t nonce, uint32_t handle, uint32_t tile) {
  TileSeal seal;
  seal.key = key;
  seal.nonce = nonce;
  seal.handle = handle;
  seal.tile = tile;
  return seal;
}

TEST_CASE("a seal written by the named peer for this handle and tile, fresh, passes") {
  CHECK(SealRefusal(Seal(0xfeed, 7, 3, 9), 0xfeed, 3, 9, 5) == nullptr);
}

TEST_CASE("another peer's key (bytes in its own range, the named peer's index) is refused") {
  const char* why = SealRefusal(Seal(0xbad, 7, 3, 9), 0xfeed, 3, 9, 5);
  REQUIRE(why != nullptr);
  CHECK(std::string(why).find("key") != std::string::npos);
}

TEST_CASE("the named peer's real bytes claimed as another tile or another transfer are refused") {
  CHECK(SealRefusal(Seal(0xfeed, 7, 3, 9), 0xfeed, 3, 10, 5) != nullptr);  // another tile
  CHECK(SealRefusal(Seal(0xfeed, 7, 3, 9), 0xfeed, 4, 9, 5) != nullptr);   // another handle
  const char* why = SealRefusal(Seal(0xfeed, 7, 3, 9), 0xfeed, 4, 9, 5);
  REQUIRE(why != nullptr);
  CHECK(std::string(why).find("handle or tile") != std::string::npos);
}

TEST_CASE("a seal consumed already (replay, spoofed completion) and an empty slot are refused") {
  CHECK(SealRefusal(Seal(0xfeed, 7, 3, 9), 0xfeed, 3, 9, 7) != nullptr);
  CHECK(SealRefusal(TileSeal{}, 0, 0, 0, 5) != nullptr);  // zeroed slot: nonce 0
  CHECK(SealRefusal(Seal(0xfeed, 0, 3, 9), 0xfeed, 3, 9, 5) != nullptr);
}

// A reclaimed peer index is given to another peer with the next generation; a
// seal of the former holder (its generation) is refused even under the same key.
TEST_CASE("a seal of an earlier holder of the peer index (another generation) is refused") {
  TileSeal seal = Seal(0xfeed, 7, 3, 9);
  seal.generation = 1;
  CHECK(SealRefusal(seal, 0xfeed, 3, 9, 5, 1) == nullptr);
  const char* why = SealRefusal(seal, 0xfeed, 3, 9, 5, 2);
  REQUIRE(why != nullptr);
  CHECK(std::string(why).find("earlier holder") != std::string::npos);
  CHECK(SealRefusal(Seal(0xfeed, 7, 3, 9), 0xfeed, 3, 9, 5, 1) != nullptr);
}

TEST_CASE("the seal is 32 bytes") { CHECK(kTileSealBytes == 32); }

}  // namespace
}  // namespace kvrail::fabric
