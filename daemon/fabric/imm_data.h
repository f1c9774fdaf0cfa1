// Internal to the fabric module: the 8 bytes of immediate data each RMA write carries (see
// proto/kvrail/peer/v1/peer.proto), and the seal written after each tile (TileSeal). A tile write:
// index(7) | handle(16) | slot(8) | tile(32); a credit: 1 | index(7) | not-applied(1) | slot(8) |
// tile(32). `index` is the number the receiving daemon
// gave the sender in Hello. Pure functions.
#pragma once

#include <cstdint>

namespace kvrail::fabric {

inline constexpr uint64_t kCreditBit = uint64_t{1} << 63;
inline constexpr uint64_t kNotAppliedBit = uint64_t{1} << 55;

inline uint64_t TileImm(uint32_t sender_index, uint32_t handle, uint32_t slot, uint32_t tile) {
  return (uint64_t{sender_index & 0x7f} << 56) | (uint64_t{handle & 0xffff} << 40) |
         (uint64_t{slot & 0xff} << 32) | tile;
}
inline uint64_t CreditImm(uint32_t index, uint32_t slot, uint32_t tile, bool applied) {
  return kCreditBit | (uint64_t{index & 0x7f} << 56) | (applied ? 0 : kNotAppliedBit) |
         (uint64_t{slot & 0xff} << 32) | tile;
}
inline uint32_t ImmIndex(uint64_t d) { return static_cast<uint32_t>((d >> 56) & 0x7f); }
inline uint32_t ImmHandle(uint64_t d) { return static_cast<uint32_t>((d >> 40) & 0xffff); }
inline uint32_t ImmSlot(uint64_t d) { return static_cast<uint32_t>((d >> 32) & 0xff); }
inline uint32_t ImmTile(uint64_t d) { return static_cast<uint32_t>(d); }

// What the proxy writes right after each tile (and its digest trailer), in the same RMA write:
// the receiver applies a tile only when the seal in the slot carries the key of that peer's
// receive registration (a secret between the two daemons, handed over mTLS), names the arrival's
// handle and tile, and has a nonce not consumed in that slot before. Immediate data is not
// authenticated by the provider (a peer can name another peer's index); the bytes of a peer's
// receive slots are (only that peer holds the registration's key), so a tile is applied only as
// its real sender wrote it, where it wrote it, once. `generation` is the generation of the
// sender's index at the receiver (PeerHello.your_index_generation): an index is reused after its
// peer left (peers.h), and a late tile of the former holder is refused by it even where the
// provider reused a registration key.
struct TileSeal {
  uint64_t key = 0;
  uint64_t nonce = 0;
  uint32_t handle = 0;
  uint32_t tile = 0;
  uint32_t generation = 0;
  uint32_t reserved = 0;
};
inline constexpr uint64_t kTileSealBytes = sizeof(TileSeal);
static_assert(kTileSealBytes == 32);

// Why the seal found after a tile does not show it as written by the peer whose receive
// registration has `key`, holding the index at `generation`, for `handle` and `tile`, fresh (the
// slot's last consumed nonce is `last_nonce`); nullptr when it does. Pure.
inline const char* SealRefusal(const TileSeal& seal, uint64_t key, uint32_t handle, uint32_t tile,
                               uint64_t last_nonce, uint32_t generation = 0) {
  if (seal.key != key) return "its seal does not carry the key of that peer's registration";
  if (seal.generation != generation) {
    return "its seal names an earlier holder of that peer index (a late tile of a peer that left)";
  }
  if (seal.handle != handle || seal.tile != tile) return "its seal names another handle or tile";
  if (seal.nonce == 0 || seal.nonce == last_nonce) return "its seal was consumed already";
  return nullptr;
}

}  // namespace kvrail::fabric
