// kernels/digest.h on the host: the definition pinned by golden values, TileHasher equal to a
// word-by-word reference however the bytes are split into runs, and the bijection property.
#include "kernels/digest.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <vector>

namespace kvrail::kernels::digest {
namespace {

// Straight from the contract: word k of stream bytes [q0, q0 + n) gets byte q at bits
// 8 * (q % 8); the digest is the sum of Mix over the words present.
uint64_t Reference(const std::vector<uint8_t>& bytes, uint64_t q0, uint64_t words_per_stream,
                   uint64_t stream) {
  std::map<uint64_t, uint64_t> words;
  for (uint64_t j = 0; j < bytes.size(); ++j) {
    const uint64_t q = q0 + j;
    words[stream * words_per_stream + q / 8] |= uint64_t{bytes[j]} << (8 * (q % 8));
  }
  uint64_t sum = 0;
  for (const auto& [key, value] : words) sum += Mix(value, key);
  return sum;
}

TEST_CASE("Mix: golden values (the digest's definition; changing them breaks peers)") {
  CHECK(Mix(0, 0) == 0x5e75b63eb870bca0ull);
  CHECK(Mix(1, 0) == 0x5e75b63f76698ec0ull);
  CHECK(Mix(0, 1) == 0x19ba209c8ad63afaull);
  CHECK(Mix(0x0123456789abcdefull, 12345) == 0x977813516fa98622ull);
  // The definition spelled out once more: (lo + k) * (hi + (k ^ flip)), 32-bit halves.
  const uint64_t w = 0xfedcba9876543210ull, key = (uint64_t{3} << 32) + 77;
  const uint32_t k = 77u * kKeyMul + 3u * kKeyMulHigh + kKeyOffset;
  CHECK(Mix(w, key) ==
        uint64_t{uint32_t(0x76543210u + k)} * uint32_t(0xfedcba98u + (k ^ kKeyFlip)));
}

TEST_CASE("a change of one 32-bit half is caught unless the other half cancels its key") {
  std::mt19937_64 rng(5);
  for (int n = 0; n < 100000; ++n) {
    const uint64_t w = rng(), key = rng() % (1ull << 40);
    const uint64_t lo_changed =
        (w & ~0xffffffffull) | ((w + 1 + rng() % 0xfffffffe) & 0xffffffffull);
    const uint64_t hi_changed = w ^ ((1 + rng() % 0xffffffffull) << 32);
    REQUIRE(Mix(w, key) != Mix(lo_changed, key));
    REQUIRE(Mix(w, key) != Mix(hi_changed, key));
    // Arbitrary changes: NH collides with probability ~2^-32; none in 100k.
    uint64_t v = rng();
    if (v == w) v ^= 1;
    REQUIRE(Mix(w, key) != Mix(v, key));
  }
  // Single bit flips, in every bit position.
  for (int bit = 0; bit < 64; ++bit) CHECK(Mix(0, 7) != Mix(uint64_t{1} << bit, 7));
  // The documented blind spot: when hi + k' == 0, lo does not matter.
  const uint32_t k = PositionKey(9);
  const uint64_t hi = uint64_t{uint32_t(0u - (k ^ kKeyFlip))} << 32;
  CHECK(Mix(hi | 5, 9) == Mix(hi | 6, 9));
  // The same word at another position (a misplaced write) gives another term.
  CHECK(Mix(42, 3) != Mix(42, 4));
}

TEST_CASE("TileHasher == reference for any split into runs, odd offsets and lengths") {
  std::mt19937_64 rng(17);
  for (int n = 0; n < 3000; ++n) {
    const uint64_t part_bytes = 1 + rng() % 5000;
    const uint64_t q0 = rng() % part_bytes;
    const uint64_t len = 1 + rng() % (part_bytes - q0);
    const uint64_t stream = rng() % 9;
    std::vector<uint8_t> bytes(len);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    const uint64_t wps = WordsPerStream(part_bytes);
    TileHasher h(wps, stream);
    uint64_t at = 0;
    while (at < len) {
      // Runs of 1..700 bytes, often 657 (an odd head vector) or 1.
      const uint64_t pick = rng() % 4;
      uint64_t run = pick == 0 ? 657 : pick == 1 ? 1 : 1 + rng() % 700;
      if (run > len - at) run = len - at;
      h.Update(bytes.data() + at, run, q0 + at);
      at += run;
    }
    REQUIRE(h.Finish() == Reference(bytes, q0, wps, stream));
  }
}

TEST_CASE("a tile's digest: one changed byte anywhere changes it; zeros are not free") {
  std::vector<uint8_t> bytes(4096 + 3);
  std::mt19937_64 rng(3);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  auto digest = [&](const std::vector<uint8_t>& v) {
    TileHasher h(WordsPerStream(v.size()), 2);
    h.Update(v.data(), v.size(), 0);
    return h.Finish();
  };
  const uint64_t d = digest(bytes);
  for (size_t i = 0; i < bytes.size(); i += 97) {
    std::vector<uint8_t> c = bytes;
    c[i] ^= 0x10;
    REQUIRE(digest(c) != d);
  }
  // All-zero content still hashes to something (a destination never written is caught when the
  // source was zeros at other positions, and vice versa).
  const std::vector<uint8_t> zeros(64, 0);
  CHECK(digest(zeros) != 0);
  // Swapping two words changes the digest (keys differ).
  std::vector<uint8_t> swapped = bytes;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  CHECK(digest(swapped) != d);
}

}  // namespace
}  // namespace kvrail::kernels::digest
