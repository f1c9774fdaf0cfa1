// Host checks of segment_math.h: the bulk-staged and split register segment forms of kv_copy.cu
// replayed on the CPU (the same packing, stage positions, unit ranges and funnel shifts the kernel
// computes), byte for byte against a plain copy, with poisoned destinations and checks that no
// read leaves the 16-byte blocks holding a segment's bytes or the stage ring.
#include "kernels/segment_math.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

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

// The kernel's SegmentOfUnit (kv_copy.cu, a shuffle search over the lanes' inclusive unit ends)
// on 32 ends: the number of lanes whose end is <= u.
uint32_t HostSegmentOfUnit(const uint32_t* end, uint32_t u) {
  uint32_t j = 0;
  for (uint32_t step = 16; step > 0; step /= 2) {
    if (end[j + step - 1] <= u) j += step;
  }
  return j;
}

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

// Replays one warp step of the bulk form: 32 pieces (lane j: segments[j]) packed into stages of
// `stage_bytes`, each stage's spans "bulk copied" into the ring, then consumed unit by unit.
// Returns the number of stages used.
int ReplayStep(const std::vector<Segment>& in, Memory& src, Memory& dst, uint32_t stage_bytes,
               bool merge = false) {
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
    for (uint32_t j = jn; j < jend; ++j) {
      const uint32_t span_at = stage_addr + (incl[j] - span[j] - base);
      REQUIRE(span_at % 16 == 0);
      if (span[j] != 0) {
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
      const uint32_t j = HostSegmentOfUnit(end, u);
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

void RunRandom(std::mt19937_64& rng, uint32_t max_len, uint32_t stage_bytes, int rounds) {
  for (int n = 0; n < rounds; ++n) {
    Memory src{0x7f0000000000ull + (rng() % 4096) * 16, std::vector<uint8_t>(32 * 8192 + 64)};
    Memory dst{0x7e0000000000ull + (rng() % 4096) * 16,
               std::vector<uint8_t>(32 * 8192 + 64, kPoison)};
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
    ReplayStep(segs, src, dst, stage_bytes, /*merge=*/false);
    if (dst.bytes != want) {
      size_t k = 0;
      while (dst.bytes[k] == want[k]) ++k;
      FAIL("first mismatch at destination byte " << k << " (round " << n << ")");
    }
  }
}

// Replays one warp step of the split register form (KvCopySegmentsSplitKernel) with 32 or 64
// segments (1 or 2 per lane): segment j cut by SplitSegment; the whole units as one stream
// (segment of a unit by UnitSegment when every segment has as many whole units, else the
// search), each read as the kernel reads it (its source block, and the next one when the source
// is not aligned relative to the destination) and stored whole; then each lane's partial units.
// Checks that every read lies in the 16-byte blocks holding the segment's source bytes and
// returns whether the step was uniform.
bool ReplaySplitStep(const std::vector<Segment>& segs, Memory& src, Memory& dst) {
  const int n = static_cast<int>(segs.size());
  REQUIRE((n == 32 || n == 64));
  SplitUnits su[64];
  uint32_t end[64];
  uint64_t table_block[64], delta[64];
  uint32_t sum = 0;
  bool uniform = true;
  for (int j = 0; j < n; ++j) {
    su[j] = SplitSegment(segs[j].d, segs[j].len);
    const uint32_t partials =
        (su[j].head.range.hi != 0 ? 1 : 0) + (su[j].tail.range.hi != 0 ? 1 : 0);
    CHECK(su[j].full + partials == SegmentUnits(segs[j].d, segs[j].len));
    uniform = uniform && su[j].full == su[0].full;
    sum += su[j].full;
    end[j] = sum;
    table_block[j] = su[j].first_full - (end[j] - su[j].full);
    delta[j] = segs[j].s - segs[j].d;
  }
  const uint32_t total = end[n - 1];
  const uint32_t full0 = su[0].full, magic = UnitMagic(full0);
  auto read16 = [&](int j, uint64_t aligned, uint8_t* to) {
    REQUIRE(aligned % 16 == 0);
    // Only blocks holding a byte of the segment's source.
    CHECK(aligned + 16 > segs[j].s);
    CHECK(aligned < segs[j].s + segs[j].len);
    std::memcpy(to, src.at(aligned), 16);
  };
  // The window of 16 source bytes for destination block `block` of lane j's segment; only
  // bytes [lo, hi) are meaningful (the kernel skips a source block holding none of them).
  auto window = [&](int j, uint64_t block, uint32_t lo, uint32_t hi, uint8_t* out) {
    const uint64_t s = (block << 4) + delta[j];
    const uint32_t r = static_cast<uint32_t>(s & 15);
    uint8_t two[32];
    std::memset(two, 0, 32);
    if (r + lo < 16) read16(j, s - r, two);
    if (r + hi > 16) read16(j, s - r + 16, two + 16);
    uint32_t w[8];
    std::memcpy(w, two, 32);
    const Words4 v = Window16(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], r);
    std::memcpy(out, v.w, 16);
  };
  for (uint32_t u = 0; u < total; ++u) {
    uint32_t j;
    if (uniform) {
      j = UnitSegment(u, full0, magic);
    } else {
      // The kernel's SegmentOfUnit in each set of 32, the last set whose units start at or
      // before u.
      j = 0;
      uint32_t before = 0;
      for (int q = 0; q < n / 32; ++q) {
        const uint32_t jq = HostSegmentOfUnit(end + 32 * q, u);
        if (u >= before) j = 32 * q + jq;
        before = end[32 * q + 31];
      }
    }
    REQUIRE(j < static_cast<uint32_t>(n));
    REQUIRE(u < end[j]);
    REQUIRE(u >= end[j] - su[j].full);
    const uint64_t block = table_block[j] + u;
    // A whole unit: inside the segment's destination.
    CHECK(block << 4 >= segs[j].d);
    CHECK((block << 4) + 16 <= segs[j].d + segs[j].len);
    uint8_t bytes[16];
    window(static_cast<int>(j), block, 0, 16, bytes);
    std::memcpy(dst.at(block << 4), bytes, 16);
  }
  for (int j = 0; j < n; ++j) {
    for (const PartialUnit& pu : {su[j].head, su[j].tail}) {
      if (pu.range.hi == 0) continue;
      REQUIRE(pu.range.lo < pu.range.hi);
      REQUIRE(pu.range.hi <= 16);
      REQUIRE(!(pu.range.lo == 0 && pu.range.hi == 16));
      uint8_t bytes[16];
      window(j, pu.block, pu.range.lo, pu.range.hi, bytes);
      ForEachPartialStore(pu.range.lo, pu.range.hi, [&](uint32_t p, uint32_t size) {
        std::memcpy(dst.at((pu.block << 4) + p), bytes + p, size);
      });
    }
  }
  return uniform;
}

// Random split-form steps: `equal` gives every lane one length and one destination alignment (a
// head-vector plan's steps), otherwise lengths and offsets vary per lane.
int RunSplit(std::mt19937_64& rng, uint32_t max_len, bool equal, int rounds, int per_lane = 1) {
  int uniform_steps = 0;
  const int count = 32 * per_lane;
  for (int n = 0; n < rounds; ++n) {
    Memory src{0x7f0000000000ull + (rng() % 4096) * 16, std::vector<uint8_t>(count * 8192 + 64)};
    Memory dst{0x7e0000000000ull + (rng() % 4096) * 16,
               std::vector<uint8_t>(count * 8192 + 64, kPoison)};
    for (auto& b : src.bytes) b = static_cast<uint8_t>(rng());
    std::vector<Segment> segs(count);
    std::vector<uint8_t> want = dst.bytes;
    const uint64_t len0 = 1 + rng() % max_len, d_align = rng() % 16;
    for (int j = 0; j < count; ++j) {
      const uint64_t len = equal ? len0 : (rng() % 7 == 0 ? 0 : 1 + rng() % max_len);
      const uint64_t so = j * 8192 + rng() % (8192 - len);
      const uint64_t d_off = equal ? j * 8192 + 16 * (rng() % ((8192 - len - 16) / 16)) + d_align
                                   : j * 8192 + rng() % (8192 - len);
      segs[j] = Segment{src.base + so, dst.base + d_off, len};
      std::memcpy(want.data() + d_off, src.bytes.data() + so, len);
    }
    uniform_steps += ReplaySplitStep(segs, src, dst) ? 1 : 0;
    if (dst.bytes != want) {
      size_t k = 0;
      while (dst.bytes[k] == want[k]) ++k;
      FAIL("first mismatch at destination byte " << k << " (round " << n << ")");
    }
  }
  return uniform_steps;
}

TEST_CASE("split form: whole and partial units of a segment") {
  // 80 bytes at destination offset 5: a head [5, 16), 4 whole units, a tail [0, 5).
  SplitUnits u = SplitSegment(0x1005, 80);
  CHECK(u.first_full == 0x101);
  CHECK(u.full == 4);
  CHECK(u.head.block == 0x100);
  CHECK(u.head.range.lo == 5);
  CHECK(u.head.range.hi == 16);
  CHECK(u.tail.block == 0x105);
  CHECK(u.tail.range.lo == 0);
  CHECK(u.tail.range.hi == 5);
  u = SplitSegment(0x1000, 256);  // aligned: whole units only
  CHECK(u.first_full == 0x100);
  CHECK(u.full == 16);
  CHECK(u.head.range.hi == 0);
  CHECK(u.tail.range.hi == 0);
  u = SplitSegment(0x1003, 5);  // inside one block: one partial unit, the head
  CHECK(u.full == 0);
  CHECK(u.head.range.lo == 3);
  CHECK(u.head.range.hi == 8);
  CHECK(u.tail.range.hi == 0);
  u = SplitSegment(0x1000, 5);  // inside one block from its start: the tail
  CHECK(u.full == 0);
  CHECK(u.head.range.hi == 0);
  CHECK(u.tail.block == 0x100);
  CHECK(u.tail.range.lo == 0);
  CHECK(u.tail.range.hi == 5);
  u = SplitSegment(0x1005, 11);  // ends on a block boundary: the head only
  CHECK(u.full == 0);
  CHECK(u.head.range.hi == 16);
  CHECK(u.tail.range.hi == 0);
  u = SplitSegment(0x100f, 0);
  CHECK(u.full == 0);
  CHECK(u.head.range.hi == 0);
  CHECK(u.tail.range.hi == 0);
  // Every length and alignment: whole + partial units == SegmentUnits, bytes covered once.
  for (uint64_t d = 0x2000; d < 0x2010; ++d) {
    for (uint64_t len = 0; len <= 80; ++len) {
      const SplitUnits s = SplitSegment(d, len);
      int covered[128] = {};
      for (uint32_t k = 0; k < s.full; ++k) {
        for (int b = 0; b < 16; ++b) ++covered[((s.first_full + k) << 4) + b - 0x2000];
      }
      for (const PartialUnit& pu : {s.head, s.tail}) {
        if (pu.range.hi == 0) continue;
        for (uint32_t b = pu.range.lo; b < pu.range.hi; ++b) {
          ++covered[(pu.block << 4) + b - 0x2000];
        }
      }
      for (uint64_t x = 0x2000; x < 0x2000 + 128; ++x) {
        REQUIRE(covered[x - 0x2000] == (x >= d && x < d + len ? 1 : 0));
      }
    }
  }
}

TEST_CASE("split form: a unit's segment by multiply-high == division") {
  for (uint32_t full = 1; full <= kSegmentPieceBytes / 16; ++full) {
    const uint32_t magic = UnitMagic(full);
    for (uint32_t u = 0; u < 64 * full; ++u) REQUIRE(UnitSegment(u, full, magic) == u / full);
  }
}

TEST_CASE("split form replay == plain copy (equal and varied segments)") {
  std::mt19937_64 rng(31);
  CHECK(RunSplit(rng, 90, /*equal=*/true, 30) == 30);  // 80-byte head vectors and the like
  CHECK(RunSplit(rng, 700, /*equal=*/true, 20) == 20);
  CHECK(RunSplit(rng, kSegmentPieceBytes, /*equal=*/true, 10) == 10);
  RunSplit(rng, 40, /*equal=*/false, 30);               // short, mixed, some empty
  CHECK(RunSplit(rng, 700, /*equal=*/false, 20) < 20);  // the search path
  RunSplit(rng, kSegmentPieceBytes, /*equal=*/false, 10);
  // Two segments per lane (64 per step).
  CHECK(RunSplit(rng, 90, /*equal=*/true, 15, 2) == 15);
  CHECK(RunSplit(rng, 700, /*equal=*/false, 10, 2) < 10);
  RunSplit(rng, 40, /*equal=*/false, 15, 2);
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
  for (int j = 0; j < 32; ++j)
    CHECK(m[j].len == (j % 6 == 0 ? (j == 30 ? 2 * 657u : 6 * 657u) : 0u));
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
  CHECK_FALSE(TakesSegmentPath(h, 8));  // merging chunks at 8-byte accesses: the slab path
  CHECK(SegmentFormFor(h) == SegmentForm::kDefault);
  h.chunk_bytes = 384;  // one of several heads: tokens 1536 bytes apart on the source
  h.src.token_stride = 1536;
  CHECK_FALSE(ChunksMayMerge(h));
  CHECK_FALSE(TakesSegmentPath(h, 16));  // the slab path
  CHECK(TakesSegmentPath(h, 2));
  CHECK(TakesSegmentPath(h, 8));  // short, not merging: the split form beats the 8-byte slab
  CHECK(SegmentFormFor(h) == SegmentForm::kSplit6);  // short, not merging
  h.chunk_bytes = 2700;
  CHECK(SegmentFormFor(h) == SegmentForm::kDefault);  // long enough for one bulk copy each
  CHECK_FALSE(TakesSegmentPath(h, 8));
  h.chunk_kind = static_cast<uint32_t>(ChunkKind::kHeadVector);
  h.chunk_bytes = 256;
  h.src.token_stride = h.dst.token_stride = 256;
  CHECK_FALSE(ChunksMayMerge(h));  // head vectors never merge
  CHECK(SegmentFormFor(h) == SegmentForm::kSplit6);
  CHECK(TakesSegmentPath(h, 8));
  CHECK(TakesSegmentPath(h, 16));  // short head vectors: the split form beats the slab path
  h.chunk_bytes = 640;
  CHECK_FALSE(TakesSegmentPath(h, 16));  // not short
  CHECK(SegmentFormFor(h) == SegmentForm::kDefault);
  h.chunk_bytes = 256;
  h.chunk_kind = static_cast<uint32_t>(ChunkKind::kBlockTokens);
  h.chunk_bytes = 32768;
  CHECK(SegmentFormFor(h) == SegmentForm::kDefault);
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
  for (int j = 0; j < 32; ++j)
    segs[j] = Segment{src.base + j * 8192 + 1, dst.base + j * 8192 + 3, 4096};
  CHECK(ReplayStep(segs, src, dst, kMaxSegmentSpanBytes) == 32);  // one 4 KiB piece per stage
  for (int j = 0; j < 32; ++j)
    segs[j] = Segment{src.base + j * 8192 + 1, dst.base + j * 8192 + 3, 657};
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

}  // namespace
}  // namespace kvrail::kernels
