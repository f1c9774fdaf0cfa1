// The integrity digest of a transfer (TransferSpec.digest): one definition, compiled for
// the host (host twin, host engine, copy-engine and fabric paths) and the GPU (kv_digest.cu).
//
// Contract.
// - Logical position. Every byte a transfer moves has a logical position that does not depend on
//   either side's layout: its stream s = layer * num_parts + part (layer and part within the
//   transfer, 0-based) and its offset q in that (layer, part) stream (device_abi.h: token-major,
//   heads inner; q in [0, part_bytes)). NHD or HND, block sizes, head ranges and per-layer regions
//   only change where the byte is, never (s, q).
// - Words. Each stream is cut into 8-byte words at q = 8k; word (s, k) has the key
//   K = s * WordsPerStream(part_bytes) + k, and its value is the little-endian uint64 of its
//   bytes, byte q at bits 8 * (q % 8). Bytes a tile does not hold (past the stream's end, or on
//   the other side of a tile boundary that is not a multiple of 8) are 0 in that tile's word.
// - Digest of a set of bytes = sum over its words of Mix(value, K), mod 2^64. The sum commutes,
//   so GPU threads, warps and CTAs add their parts in any order, and a transfer's digest is the
//   sum of its tiles' digests. A tile's digest depends on its bytes, the plan's part_bytes and
//   tile_bytes only (tiles cut streams at the same places on both sides of a transfer: one plan
//   header, or the same tile_bytes on both daemons of a fabric transfer); with tile_bytes a
//   multiple of 8 (the default 1 MiB always is) it does not depend on the tiling at all.
// - Odd sizes. Runs are not multiples of 8 (657-byte head vectors) and start at any q: a word may
//   take bytes from several runs, so a tile is hashed in stream order through TileHasher, which
//   keeps the partial word across runs (tail handling by logical byte index, not by run).
// - Strength (NH, the universal hash of UMAC: Black et al., 1999). A word's term is the 64-bit
//   product (lo + k) * (hi + k') of its 32-bit halves offset by position keys (k from the key,
//   k' = k ^ kKeyFlip; arithmetic mod 2^32, the product exact). A change confined to one half of
//   one word is always caught unless the other half plus its key is 0 mod 2^32 (a 2^-32 chance
//   for arbitrary data); any other change of a tile collides with probability about 2^-32. The
//   position enters through the keys, so a word written to the wrong place changes its term too.
//   Chosen for the GPU: about ten integer operations per 8-byte word (a 32x32->64 multiply, no
//   64-bit multiplies), so the fused kernel's hashing hides behind its memory traffic
//   (docs/benchmarks.md). Not a MAC: it detects corruption and stale or
//   misplaced writes, not an adversary who chooses bytes.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define KVRAIL_DIGEST_HD __host__ __device__ __forceinline__
#else
#define KVRAIL_DIGEST_HD inline
#endif

namespace kvrail::kernels::digest {

inline constexpr uint64_t kWordBytes = 8;
// Position keys: k = lo32(key) * kKeyMul + hi32(key) * kKeyMulHigh + kKeyOffset (mod 2^32).
inline constexpr uint32_t kKeyMul = 0x9E3779B9u;      // odd (2^32 / golden ratio)
inline constexpr uint32_t kKeyMulHigh = 0x85EBCA6Bu;  // odd (murmur3's constants)
inline constexpr uint32_t kKeyOffset = 0x7F4A7C15u;
inline constexpr uint32_t kKeyFlip = 0xC2B2AE35u;
static_assert(kKeyMul % 2 == 1 && kKeyMulHigh % 2 == 1, "odd multipliers: distinct low keys");
static_assert(sizeof(uint64_t) == kWordBytes, "words are uint64");

// The 32-bit key of word position `key`.
KVRAIL_DIGEST_HD uint32_t PositionKey(uint64_t key) {
  return static_cast<uint32_t>(key) * kKeyMul + static_cast<uint32_t>(key >> 32) * kKeyMulHigh +
         kKeyOffset;
}

// The term of word value `w` whose position key is `k` (PositionKey).
KVRAIL_DIGEST_HD uint64_t MixKeyed(uint64_t w, uint32_t k) {
  const uint32_t a = static_cast<uint32_t>(w) + k;
  const uint32_t b = static_cast<uint32_t>(w >> 32) + (k ^ kKeyFlip);
  return static_cast<uint64_t>(a) * b;
}

// The term of word value `w` at position `key` (see the contract above).
KVRAIL_DIGEST_HD uint64_t Mix(uint64_t w, uint64_t key) { return MixKeyed(w, PositionKey(key)); }

// Words of one (layer, part) stream.
KVRAIL_DIGEST_HD uint64_t WordsPerStream(uint64_t part_bytes) {
  return (part_bytes + kWordBytes - 1) / kWordBytes;
}

// The key of the word holding stream byte q of stream s.
KVRAIL_DIGEST_HD uint64_t WordKey(uint64_t words_per_stream, uint64_t stream, uint64_t q) {
  return stream * words_per_stream + q / kWordBytes;
}

// Reads `n` bytes (n <= 8) from `p` into a word, byte j at bits 8 * (lane + j): the bytes of
// stream positions [q, q + n) with lane = q % 8, all inside one word.
KVRAIL_DIGEST_HD uint64_t PartialWord(const uint8_t* p, uint32_t n, uint32_t lane) {
  uint64_t w = 0;
  for (uint32_t j = 0; j < n; ++j) w |= static_cast<uint64_t>(p[j]) << (8 * (lane + j));
  return w;
}

// Hashes the bytes of one tile fed in stream order (consecutive runs of one stream, each starting
// where the previous ended, as planner::ForEachTileRun and a packed tile give them). Words split
// between runs are completed before they are mixed. Plain state; one per tile.
class TileHasher {
 public:
  // `stream` = layer * num_parts + part of the tile; `words_per_stream` = WordsPerStream.
  KVRAIL_DIGEST_HD TileHasher(uint64_t words_per_stream, uint64_t stream)
      : base_key_(stream * words_per_stream) {}

  // Adds stream bytes [q, q + n), read from `p`.
  KVRAIL_DIGEST_HD void Update(const uint8_t* p, uint64_t n, uint64_t q) {
    while (n > 0) {
      const uint64_t key = base_key_ + q / kWordBytes;
      const uint32_t lane = static_cast<uint32_t>(q % kWordBytes);
      if (lane == 0 && n >= kWordBytes) {
        // Whole words: the fast loop, one PositionKey per stretch of keys with equal high 32 bits
        // (the next key's is then k + kKeyMul).
        if (has_pending_) Flush();
        const uint64_t words = n / kWordBytes;
        for (uint64_t done = 0; done < words;) {
          const uint64_t at = key + done;
          const uint64_t room = (uint64_t{1} << 32) - (at & 0xffffffffull);
          const uint64_t m = words - done < room ? words - done : room;
          sum_ += SumWords(p + done * kWordBytes, m, PositionKey(at));
          done += m;
        }
        p += words * kWordBytes;
        q += words * kWordBytes;
        n -= words * kWordBytes;
        continue;
      }
      const uint32_t take = static_cast<uint32_t>(n < kWordBytes - lane ? n : kWordBytes - lane);
      if (has_pending_ && pending_key_ != key) Flush();
      pending_ |= PartialWord(p, take, lane);
      pending_key_ = key;
      has_pending_ = true;
      if (lane + take == kWordBytes) Flush();
      p += take;
      q += take;
      n -= take;
    }
  }

  // The tile's digest (the hasher may not be fed afterwards).
  KVRAIL_DIGEST_HD uint64_t Finish() {
    if (has_pending_) Flush();
    return sum_;
  }

 private:
  KVRAIL_DIGEST_HD static uint64_t LoadWord(const uint8_t* p) {
    uint64_t w = 0;
#ifdef __CUDA_ARCH__
    for (int j = 0; j < 8; ++j) w |= static_cast<uint64_t>(p[j]) << (8 * j);
#else
    __builtin_memcpy(&w, p, sizeof(w));  // little-endian hosts only (x86-64, aarch64)
#endif
    return w;
  }
  // Sum of the terms of `m` whole words at `p` whose first key is `k` (keys k + j * kKeyMul):
  // four independent sums so the multiplies overlap (and compilers can vectorize: NH's
  // 32x32->64 products are what SIMD multiplies do).
  KVRAIL_DIGEST_HD static uint64_t SumWords(const uint8_t* p, uint64_t m, uint32_t k) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    uint64_t j = 0;
    for (; j + 4 <= m; j += 4) {
      s0 += MixKeyed(LoadWord(p + (j + 0) * kWordBytes), k);
      s1 += MixKeyed(LoadWord(p + (j + 1) * kWordBytes), k + kKeyMul);
      s2 += MixKeyed(LoadWord(p + (j + 2) * kWordBytes), k + 2 * kKeyMul);
      s3 += MixKeyed(LoadWord(p + (j + 3) * kWordBytes), k + 3 * kKeyMul);
      k += 4 * kKeyMul;
    }
    for (; j < m; ++j, k += kKeyMul) s0 += MixKeyed(LoadWord(p + j * kWordBytes), k);
    return s0 + s1 + s2 + s3;
  }
  KVRAIL_DIGEST_HD void Flush() {
    sum_ += Mix(pending_, pending_key_);
    pending_ = 0;
    has_pending_ = false;
  }

  uint64_t base_key_;
  uint64_t sum_ = 0;
  uint64_t pending_ = 0;
  uint64_t pending_key_ = 0;
  bool has_pending_ = false;
};

#ifndef __CUDA_ARCH__
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "digest words are little-endian");
#endif

}  // namespace kvrail::kernels::digest
