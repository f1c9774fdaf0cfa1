// ExecuteTileHost: the host twin of the CUDA kernel. Same address arithmetic (plan_math.h), with
// memcpy of chunks; chunks that turn out adjacent on both sides are merged into one memcpy. And
// the host side of the integrity digest (kernels/digest.h) over the same runs.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/planner/planner.h"
#include "kernels/digest.h"
#include "kernels/plan_math.h"

namespace kvrail::planner {
namespace {

namespace dg = ::kvrail::kernels::digest;

// The hasher for tile `tile` and the stream offset of its first byte.
dg::TileHasher HasherFor(const kernels::PlanHeader& h, const kernels::TileDesc& t) {
  return dg::TileHasher(dg::WordsPerStream(h.part_bytes),
                        static_cast<uint64_t>(t.layer) * h.num_parts + t.part);
}

// Copying and hashing go in slices this large, so the hash reads what the copy just brought into
// the cache ("while copying": the source is fetched from memory once).
constexpr uint64_t kSliceBytes = 16 << 10;

}  // namespace

void ExecuteTileHost(const Plan& plan, uint32_t tile, const uint8_t* src_base, uint8_t* dst_base) {
  const kernels::PlanHeader& h = plan.header();
  ForEachTileRun(plan, tile, [&](const CopyRun& run) {
    std::memcpy(HostAddress(h.dst, dst_base, run.dst), HostAddress(h.src, src_base, run.src),
                run.bytes);
  });
}

uint64_t ExecuteTileHostWithDigest(const Plan& plan, uint32_t tile, const uint8_t* src_base,
                                   uint8_t* dst_base) {
  const kernels::PlanHeader& h = plan.header();
  const kernels::TileDesc t = kernels::TileAt(h, tile);
  dg::TileHasher hasher = HasherFor(h, t);
  uint64_t q = t.byte_begin;
  ForEachTileRun(plan, tile, [&](const CopyRun& run) {
    const uint8_t* from = HostAddress(h.src, src_base, run.src);
    uint8_t* to = HostAddress(h.dst, dst_base, run.dst);
    for (uint64_t done = 0; done < run.bytes;) {
      const uint64_t n = std::min(kSliceBytes, run.bytes - done);
      std::memcpy(to + done, from + done, n);
      hasher.Update(from + done, n, q);  // the source slice, now in the cache
      done += n;
      q += n;
    }
  });
  return hasher.Finish();
}

uint64_t TileDigestHost(const Plan& plan, uint32_t tile, const uint8_t* base, DigestSide side) {
  const kernels::PlanHeader& h = plan.header();
  const kernels::TileDesc t = kernels::TileAt(h, tile);
  dg::TileHasher hasher = HasherFor(h, t);
  uint64_t q = t.byte_begin;
  const bool src = side == DigestSide::kSource;
  ForEachTileRun(plan, tile, [&](const CopyRun& run) {
    hasher.Update(HostAddress(src ? h.src : h.dst, base, src ? run.src : run.dst), run.bytes, q);
    q += run.bytes;
  });
  return hasher.Finish();
}

uint64_t PackedTileDigest(const Plan& plan, uint32_t tile, const uint8_t* packed) {
  const kernels::PlanHeader& h = plan.header();
  const kernels::TileDesc t = kernels::TileAt(h, tile);
  dg::TileHasher hasher = HasherFor(h, t);
  hasher.Update(packed, t.byte_end - t.byte_begin, t.byte_begin);
  return hasher.Finish();
}

absl::Status DigestMismatchError(const Plan& plan, uint32_t tile, uint64_t source,
                                 uint64_t destination) {
  return absl::DataLossError(
      absl::StrCat("integrity digest mismatch in tile ", tile, " (layer ",
                   plan.header().src.layer_begin + plan.tile(tile).layer, "): destination digest ",
                   absl::Hex(destination, absl::kZeroPad16), " != source digest ",
                   absl::Hex(source, absl::kZeroPad16)));
}

}  // namespace kvrail::planner
