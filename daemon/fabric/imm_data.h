// Internal to the fabric module: the 8 bytes of immediate data each RMA write carries (see
// proto/kvrail/v1/peer.proto). A tile write: index(7) | handle(16) | slot(8) | tile(32); a credit:
// 1 | index(7) | not-applied(1) | slot(8) | tile(32). `index` is the number the receiving daemon
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

}  // namespace kvrail::fabric
