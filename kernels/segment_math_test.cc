// Host checks of segment_math.h: the bulk-staged segment path of kv_copy.cu replayed on the CPU
// (the same packing, stage positions, unit ranges and funnel shifts the kernel computes), byte for
// byte against a plain copy, with poisoned destinations and checks that no read leaves the
// 16-byte blocks holding a segment's bytes or the stage ring.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/segment_math.h"

namespace kvrail::kernels {
namespace {

constexpr uint8_t kPoison = 0xAB;

struct Segment {
  uint64_t s, d, len;  // addresses (fake 64-bit) and bytes
};

// A fake address space: [base, base + bytes) backed by a vector.
struct Memory {
  uint64_t base;
  std::vector<uint8_t> bytes;
  uint8_t* at(uint64_t addr) {
    REQUIRE(addr >= base);
    REQUIRE(addr < base + bytes.size());
    return bytes.data() + (addr - base);
  }
};

uint32_t Word(const std::vector<uint8_t>& ring, uint32_t ring_addr, uint32_t addr) {
  REQUIRE(addr >= ring_addr);
  REQUIRE(addr + 4 <= ring_addr + ring.size());
  uint32_t w;
  std::memcpy(&w, ring.data() + (addr - ring_addr), 4);
  return w;
}

// Replays one warp step of the bulk form: 32 pieces (lane j: segments[j]) packed into stages of
// `stage_bytes`, each stage's spans "bulk copied" into the ring, then consumed unit by unit.
// Returns the number of stages used.
// The kernel's merge of pieces contiguous on both sides (prepare() in KvCopySegmentsBulkKernel),
// lane by lane: a run's first piece takes the run's bytes, the others none.
std::vector<Segment> Merge(const std::vector<Segment>& in) {
  std::vector<Segment> out = in;
  bool cont[32];
  uint32_t max_len = 0;
  for (int j = 0; j < 32; ++j) {
    cont[j] = j > 0 && ContinuesPiece(in[j - 1].s + in[j - 1].len, in[j - 1].d + in[j - 1].len,
                                      static_cast<uint32_t>(in[j - 1].len), in[j].s, in[j].d,
                                      static_cast<uint32_t>(in[j].len));
    max_len = std::max<uint32_t>(max_len, static_cast<uint32_t>(in[j].len));
  }
  const uint32_t per_run = MergeRunPieces(max_len);
  bool head[32];
  uint32_t run_start = 0;
  for (uint32_t j = 0; j < 32; ++j) {
    if (!cont[j]) run_start = j;
    head[j] = MergeHead(cont[j], j, run_start, per_run);
  }
  for (int j = 0; j < 32; ++j) {
    if (!head[j]) {
      out[j].len = 0;
      continue;
    }
    uint64_t len = in[j].len;
    for (int k = j + 1; k < 32 && !head[k]; ++k) {
      REQUIRE(cont[k]);
      len += in[k].len;
    }
    REQUIRE(len <= kSegmentPieceBytes);
    out[j].len = len;
  }
  return out;
}

int ReplayStep(const std::vector<Segment>& in, Memory& src, Memory& dst, uint32_t stage_bytes,
               bool merge = false, bool lane_copies = false) {
  REQUIRE(in.size() == 32);
  const std::vector<Segment> segs = merge ? Merge(in) : in;
  // The ring: head pad, one stage (the kernel rotates several; one shows the arithmetic), tail pad.
  const uint32_t ring_addr = 0x1000;  // shared address of the ring's first byte
  const uint32_t stage_addr = ring_addr + kStageRingHead;
  std::vector<uint8_t> ring(kStageRingPad + stage_bytes);
  uint32_t span[32], incl[32];
  uint32_t sum = 0;
  for (int j = 0; j < 32; ++j) {
    const SourceSpanBytes sp = SourceSpan(segs[j].s, segs[j].len);
    span[j] = sp.bytes;
    REQUIRE(span[j] <= kMaxSegmentSpanBytes);
    REQUIRE(span[j] % 16 == 0);
    REQUIRE(sp.begin % 16 == 0);
    if (segs[j].len != 0) {
      // Only the 16-byte blocks holding the segment's bytes.
      CHECK(sp.begin == (segs[j].s & ~uint64_t{15}));
      CHECK(sp.begin + span[j] - 16 <= segs[j].s + segs[j].len - 1);
      CHECK(sp.begin + span[j] >= segs[j].s + segs[j].len);
    }
    sum += span[j];
    incl[j] = sum;
  }
  uint32_t jn = 0;
  int stages = 0;
  while (jn < 32 && incl[31] > (jn == 0 ? 0 : incl[jn - 1])) {
    const uint32_t base = jn == 0 ? 0 : incl[jn - 1];
    uint32_t jend = jn;
    for (uint32_t j = jn; j < 32; ++j) {
      if (StageFits(incl[j], base, stage_bytes)) jend = j + 1;  // the kernel's ballot
    }
    REQUIRE(jend > jn);
    REQUIRE(incl[jend - 1] - base <= stage_bytes);
    ++stages;
    std::fill(ring.begin(), ring.end(), 0x5A);  // stale bytes from an earlier stage
    // The bulk copies and each piece's stage position.
    uint64_t m_dst[32] = {};
    uint32_t m_len[32] = {}, m_pos[32] = {};
    uint32_t pieces = 0;
    for (uint32_t j = jn; j < jend; ++j) pieces += span[j] != 0 ? 1 : 0;
    if (lane_copies && pieces > 1) {
      // The kernel's lane copies: stage block b from the piece whose span holds it (the search
      // over span ends in blocks; lanes before the stage count as ended, lanes after never end).
      uint32_t span_end[32];
      uint64_t from[32];
      for (uint32_t j = 0; j < 32; ++j) {
        span_end[j] = j < jn ? 0u : j >= jend ? 0xffffffffu : (incl[j] - base) / 16;
        from[j] = SourceSpan(segs[j].s, segs[j].len).begin - 16 * uint64_t{(incl[j] - span[j] - base) / 16};
      }
      for (uint32_t b = 0; b < (incl[jend - 1] - base) / 16; ++b) {
        uint32_t j = 0;
        for (uint32_t step = 16; step > 0; step /= 2) {
          if (span_end[j + step - 1] <= b) j += step;
        }
        REQUIRE(j >= jn);
        REQUIRE(j < jend);
        REQUIRE(span[j] != 0);
        std::memcpy(ring.data() + (stage_addr + 16 * b - ring_addr), src.at(from[j] + 16 * b), 16);
      }
    }
    for (uint32_t j = jn; j < jend; ++j) {
      const uint32_t span_at = stage_addr + (incl[j] - span[j] - base);
      REQUIRE(span_at % 16 == 0);
      if (span[j] != 0 && !(lane_copies && pieces > 1)) {
        const SourceSpanBytes sp = SourceSpan(segs[j].s, segs[j].len);
        std::memcpy(ring.data() + (span_at - ring_addr), src.at(sp.begin), span[j]);
      }
      m_dst[j - jn] = segs[j].d;
      m_len[j - jn] = static_cast<uint32_t>(segs[j].len);
      m_pos[j - jn] = StagePos(span_at, segs[j].s, segs[j].d, segs[j].d);
    }
    // The consumer: units of the stage's pieces as one stream.
    uint32_t units[32], end[32], q[32];
    uint64_t block0[32];
    uint32_t e = 0;
    for (int t = 0; t < 32; ++t) {
      units[t] = SegmentUnits(m_dst[t], m_len[t]);
      e += units[t];
      end[t] = e;
      block0[t] = (m_dst[t] >> 4) - (end[t] - units[t]);
      q[t] = m_pos[t] - static_cast<uint32_t>(m_dst[t]) + (static_cast<uint32_t>(block0[t]) << 4);
    }
    for (uint32_t u = 0; u < end[31]; ++u) {
      uint32_t j = 0;  // the kernel's SegmentOfUnit
      for (uint32_t step = 16; step > 0; step /= 2) {
        if (end[j + step - 1] <= u) j += step;
      }
      REQUIRE(u < end[j]);
      REQUIRE(u >= end[j] - units[j]);
      const uint64_t block = (block0[j] + u) << 4;
      const UnitRange ur = UnitBytes(block, static_cast<uint32_t>(m_dst[j]),
                                     static_cast<uint32_t>(m_dst[j] + m_len[j]));
      REQUIRE(ur.lo < ur.hi);
      REQUIRE(ur.hi <= 16);
      const uint32_t p = q[j] + 16 * u;
      // Every unit's source byte is where the span copy put it.
      CHECK(p == StagePos(m_pos[j] - static_cast<uint32_t>(segs[jn + j].s & 15), segs[jn + j].s,
                          m_dst[j], block));
      const uint32_t a = p & ~15u;
      uint32_t w[8];
      for (int k = 0; k < 8; ++k) w[k] = Word(ring, ring_addr, a + 4 * k);
      const Words4 v = Window16(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], p & 15);
      uint8_t bytes[16];
      std::memcpy(bytes, v.w, 16);
      for (uint32_t b = ur.lo; b < ur.hi; ++b) *dst.at(block + b) = bytes[b];
    }
    jn = jend;
  }
  return stages;
}

// Runs of contiguous pieces (each continuing the previous one on both sides with probability
// 3/4), merged as the kernel merges them, against the plain copy.
void RunContiguous(std::mt19937_64& rng, uint32_t max_len, int rounds) {
  for (int n = 0; n < rounds; ++n) {
    Memory src{0x7f0000000000ull, std::vector<uint8_t>(32 * 4096 + 4096)};
    Memory dst{0x7e0000000000ull, std::vector<uint8_t>(32 * 4096 + 4096, kPoison)};
    for (auto& b : src.bytes) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> want = dst.bytes;
    std::vector<Segment> segs(32);
    uint64_t so = rng() % 16, d_off = rng() % 16;
    const uint64_t len = 1 + rng() % max_len;  // one piece length per step, as a plan has
    for (int j = 0; j < 32; ++j) {
      if (j > 0 && rng() % 4 == 0) {  // a gap on one side or both: a new run
        so += 1 + rng() % 7;
        if (rng() % 2) d_off += 1 + rng() % 7;
      }
      const uint64_t l = rng() % 9 == 0 ? 0 : len;
      segs[j] = Segment{src.base + so, dst.base + d_off, l};
      std::memcpy(want.data() + d_off, src.bytes.data() + so, l);
      so += l;
      d_off += l;
    }
    ReplayStep(segs, src, dst, kMaxSegmentSpanBytes, /*merge=*/true);
    if (dst.bytes != want) {
      size_t k = 0;
      while (dst.bytes[k] == want[k]) ++k;
      FAIL("first mismatch at destination byte " << k << " (round " << n << ")");
    }
  }
}

void RunRandom(std::mt19937_64& rng, uint32_t max_len, uint32_t stage_bytes, int rounds,
               bool lane_copies = false) {
  for (int n = 0; n < rounds; ++n) {
    Memory src{0x7f0000000000ull + (rng() % 4096) * 16, std::vector<uint8_t>(32 * 8192 + 64)};
    Memory dst{0x7e0000000000ull + (rng() % 4096) * 16, std::vector<uint8_t>(32 * 8192 + 64, kPoison)};
    for (auto& b : src.bytes) b = static_cast<uint8_t>(rng());
    std::vector<Segment> segs(32);
    std::vector<uint8_t> want = dst.bytes;
    for (int j = 0; j < 32; ++j) {
      // Disjoint 8 KiB slots, random offsets inside, random lengths (some empty).
      const uint64_t len = rng() % 7 == 0 ? 0 : 1 + rng() % max_len;
      const uint64_t so = j * 8192 + rng() % (8192 - len), d_off = j * 8192 + rng() % (8192 - len);
      segs[j] = Segment{src.base + so, dst.base + d_off, len};
      std::memcpy(want.data() + d_off, src.bytes.data() + so, len);
    }
    ReplayStep(segs, src, dst, stage_bytes, /*merge=*/false, lane_copies);
    if (dst.bytes != want) {
      size_t k = 0;
      while (dst.bytes[k] == want[k]) ++k;
      FAIL("first mismatch at destination byte " << k << " (round " << n << ")");
    }
  }
}

TEST_CASE("units and spans of a segment") {
  CHECK(SegmentUnits(0, 0) == 0);
  CHECK(SegmentUnits(0, 16) == 1);
  CHECK(SegmentUnits(3, 16) == 2);
  CHECK(SegmentUnits(3, 13) == 1);
  CHECK(SegmentUnits(3, 14) == 2);
  CHECK(SegmentUnits(1, 657) == 42);  // bytes 1..657: blocks 0..41
  const SourceSpanBytes a = SourceSpan(0x1003, 657);
  CHECK(a.begin == 0x1000);
  CHECK(a.bytes == 672);  // 0x1000..0x12a0: 0x1003 + 657 = 0x1294
  CHECK(SourceSpan(0x1000, 4096).bytes == 4096);
  CHECK(SourceSpan(0x1001, 4096).bytes == 4112);
  CHECK(SourceSpan(0x100f, 0).bytes == 0);
  const UnitRange head = UnitBytes(0x2000, 0x2006, 0x2100);
  CHECK(head.lo == 6);
  CHECK(head.hi == 16);
  const UnitRange tail = UnitBytes(0x20f0, 0x2006, 0x20f3);
  CHECK(tail.lo == 0);
  CHECK(tail.hi == 3);
  const UnitRange inside = UnitBytes(0x2000, 0x2003, 0x2005);
  CHECK(inside.lo == 3);
  CHECK(inside.hi == 5);
}

TEST_CASE("Window16 takes bytes [r, r + 16) of 32 bytes for every shift") {
  uint8_t bytes[32];
  for (int k = 0; k < 32; ++k) bytes[k] = static_cast<uint8_t>(7 * k + 1);
  uint32_t w[8];
  std::memcpy(w, bytes, 32);
  for (uint32_t r = 0; r < 16; ++r) {
    const Words4 v = Window16(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], r);
    uint8_t got[16];
    std::memcpy(got, v.w, 16);
    CHECK(std::memcmp(got, bytes + r, 16) == 0);
  }
  CHECK(FunnelShiftR(0x11223344u, 0xaabbccddu, 8) == 0xdd112233u);
  CHECK(FunnelShiftR(0x11223344u, 0xaabbccddu, 0) == 0x11223344u);
}

TEST_CASE("partial units: aligned stores covering [lo, hi) once, straight-line") {
  for (uint32_t lo = 0; lo < 16; ++lo) {
    for (uint32_t hi = lo + 1; hi <= 16; ++hi) {
      if (lo == 0 && hi == 16) continue;  // a whole unit: one 16-byte store
      int covered[16] = {};
      int stores = 0;
      ForEachPartialStore(lo, hi, [&](uint32_t p, uint32_t size) {
        CHECK(p % size == 0);
        for (uint32_t b = p; b < p + size; ++b) {
          REQUIRE(b < 16);
          ++covered[b];
        }
        ++stores;
      });
      for (uint32_t b = 0; b < 16; ++b) CHECK(covered[b] == (b >= lo && b < hi ? 1 : 0));
      CHECK(stores <= 8);
    }
  }
}

TEST_CASE("merging contiguous pieces: runs of at most a piece, same bytes") {
  CHECK(MergeRunPieces(657) == 6);
  CHECK(MergeRunPieces(4096) == 1);
  CHECK(MergeRunPieces(0) == 1);
  CHECK(ContinuesPiece(100, 200, 5, 100, 200, 7));
  CHECK_FALSE(ContinuesPiece(100, 200, 5, 101, 200, 7));
  CHECK_FALSE(ContinuesPiece(100, 200, 5, 100, 201, 7));
  CHECK_FALSE(ContinuesPiece(100, 200, 0, 100, 200, 7));
  CHECK_FALSE(ContinuesPiece(100, 200, 5, 100, 200, 0));
  // 657-byte tokens contiguous on both sides: 32 pieces -> runs of 6 (6 x 657 = 3942 bytes).
  std::vector<Segment> segs(32);
  for (int j = 0; j < 32; ++j) segs[j] = Segment{1001 + 657u * j, 5003 + 657u * j, 657};
  const std::vector<Segment> m = Merge(segs);
  for (int j = 0; j < 32; ++j) CHECK(m[j].len == (j % 6 == 0 ? (j == 30 ? 2 * 657u : 6 * 657u) : 0u));
  std::mt19937_64 rng(23);
  RunContiguous(rng, 700, 300);
  RunContiguous(rng, 100, 200);
  RunContiguous(rng, kSegmentPieceBytes, 100);
}

TEST_CASE("segment path and form per plan") {
  PlanHeader h{};
  h.chunk_kind = static_cast<uint32_t>(ChunkKind::kTokenHeads);
  h.chunk_bytes = 576;  // MLA tokens, 64 -> 16 per block: contiguous from token to token
  h.src.token_stride = 576;
  h.dst.token_stride = 576;
  CHECK(ChunksMayMerge(h));
  CHECK_FALSE(TakesSegmentPath(h, 16));  // the slab path (faster at 132 CTAs)
  CHECK(TakesSegmentPath(h, 1));
  CHECK(SegmentFormFor(h) == kSegmentFormDefault);
  h.chunk_bytes = 384;  // one of several heads: tokens 1536 bytes apart on the source
  h.src.token_stride = 1536;
  CHECK_FALSE(ChunksMayMerge(h));
  CHECK_FALSE(TakesSegmentPath(h, 16));  // the slab path
  CHECK(TakesSegmentPath(h, 2));
  CHECK(SegmentFormFor(h) == kSegmentFormRegisters);  // short, not merging
  h.chunk_bytes = 2700;
  CHECK(SegmentFormFor(h) == kSegmentFormDefault);  // long enough for one bulk copy each
  h.chunk_kind = static_cast<uint32_t>(ChunkKind::kHeadVector);
  h.chunk_bytes = 256;
  h.src.token_stride = h.dst.token_stride = 256;
  CHECK_FALSE(ChunksMayMerge(h));  // head vectors never merge
  CHECK(SegmentFormFor(h) == kSegmentFormRegisters);
  h.chunk_kind = static_cast<uint32_t>(ChunkKind::kBlockTokens);
  h.chunk_bytes = 32768;
  CHECK(SegmentFormFor(h) == kSegmentFormDefault);
  CHECK(TakesSegmentPath(h, 2));
  CHECK_FALSE(TakesSegmentPath(h, 8));
  h.chunk_kind = static_cast<uint32_t>(ChunkKind::kBytes);
  CHECK_FALSE(TakesSegmentPath(h, 1));
}

TEST_CASE("stage size for a launch shape") {
  // 512 threads, 3 stages in 200 KiB: a piece's largest span fits.
  const uint32_t b3 = StageBytesFor(200 * 1024, 16, 3);
  CHECK(b3 >= kMaxSegmentSpanBytes);
  CHECK(b3 % 16 == 0);
  CHECK(kStageRingPad + 16u * 3 * b3 <= 200u * 1024);
  CHECK(StageBytesFor(200 * 1024, 16, 2) > b3);
  CHECK(StageBytesFor(200 * 1024, 1, 2) == kMaxStageBytes);
  CHECK(StageBytesFor(200 * 1024, 16, 4) == 0);  // under a piece's span: refused
  CHECK(StageBytesFor(200 * 1024, 0, 3) == 0);
}

TEST_CASE("packing: a stage takes pieces while their spans fit, at least one") {
  std::mt19937_64 rng(5);
  Memory src{0x7f0000000000ull, std::vector<uint8_t>(32 * 8192 + 64)};
  Memory dst{0x7e0000000000ull, std::vector<uint8_t>(32 * 8192 + 64, kPoison)};
  std::vector<Segment> segs(32);
  for (int j = 0; j < 32; ++j) segs[j] = Segment{src.base + j * 8192 + 1, dst.base + j * 8192 + 3, 4096};
  CHECK(ReplayStep(segs, src, dst, kMaxSegmentSpanBytes) == 32);  // one 4 KiB piece per stage
  for (int j = 0; j < 32; ++j) segs[j] = Segment{src.base + j * 8192 + 1, dst.base + j * 8192 + 3, 657};
  // Spans of 672 bytes: 6 per 4128-byte stage, 32 pieces in 6 stages.
  CHECK(ReplayStep(segs, src, dst, kMaxSegmentSpanBytes) == 6);
  for (int j = 0; j < 32; ++j) segs[j] = Segment{0, 0, 0};
  CHECK(ReplayStep(segs, src, dst, kMaxSegmentSpanBytes) == 0);  // nothing to stage
}

TEST_CASE("bulk-staged replay == plain copy (random segments, alignments, lengths)") {
  std::mt19937_64 rng(19);
  RunRandom(rng, 40, kMaxSegmentSpanBytes, 200);                  // short, many per stage
  RunRandom(rng, 700, kMaxSegmentSpanBytes, 200);                 // 657-byte-like tokens
  RunRandom(rng, kSegmentPieceBytes, kMaxSegmentSpanBytes, 200);  // up to whole pieces
  RunRandom(rng, kSegmentPieceBytes, StageBytesFor(200 * 1024, 16, 2), 100);
  RunRandom(rng, 300, StageBytesFor(200 * 1024, 16, 3), 100);
}

TEST_CASE("bulk-staged replay with lane copies for several-piece stages == plain copy") {
  std::mt19937_64 rng(29);
  RunRandom(rng, 40, kMaxSegmentSpanBytes, 200, /*lane_copies=*/true);
  RunRandom(rng, 300, kMaxSegmentSpanBytes, 200, /*lane_copies=*/true);
  RunRandom(rng, kSegmentPieceBytes, StageBytesFor(200 * 1024, 16, 2), 200, /*lane_copies=*/true);
}

}  // namespace
}  // namespace kvrail::kernels
