// The named layouts through the fused kernel alone (no daemon), sources on --src-gpu and
// destinations on --dst-gpu (GPU0 -> GPU0 by default; the kernel runs on the source GPU): each
// case is checked byte for byte against the host twin (destination poisoned first), then timed
// (median, min and max of 20 launches, CUDA events) at 32 CTAs (the daemon's shipped default
// budget, cuda_max_ctas) and 132 (tuned: the whole GPU), beside the
// aligned serving layout (whole 16-token NHD blocks, scattered) measured in the same run. Prints
// one table: GB/s, the kernel path taken (warp pieces / chunk segments / slab with its access
// width) and the ratio to the aligned baseline (target: >= 50%).
// Each chunked plan also runs every form of the segment path (registers; bulk-staged with one
// bulk copy per piece; split registers with 4 and 6 whole units per lane) at 32 and 132 CTAs,
// each checked byte for byte too. LAYOUT_RANDOM=n adds n random layouts (RandomCases) after the
// named ones; LAYOUT_ONLY=i,j,... keeps only those cases (indices in the printed order, named
// first; the aligned baseline, case 0, always runs).
// Usage: [LAYOUT_RANDOM=n] [LAYOUT_ONLY=i,j,...] layout_bench [--quick] [--src-gpu N] [--dst-gpu N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/planner/planner.h"
#include "kernels/kv_copy.h"
#include "kernels/kv_copy_forms.h"
#include "kernels/plan_math.h"
#include "tests/gpu/bench_check.h"
#include "tests/gpu/gpu_util.h"

namespace kvrail {
namespace {

using v1::PagedKvLayout;

gpu_bench::GpuPair g_pair;  // set once by main

// `bytes` of device memory on GPU `device`; the source GPU stays current (the kernel runs there).
void* AllocOn(int device, size_t bytes) {
  gpu_bench::Check(cudaSetDevice(device), "cudaSetDevice");
  void* p = gpu_test::DeviceAlloc(bytes);
  gpu_bench::Check(cudaSetDevice(g_pair.src), "cudaSetDevice");
  return p;
}

struct Side {
  PagedKvLayout layout;
  uint32_t transfer_blocks = 0;  // blocks the transfer touches (scattered over the pool)
};

struct Case {
  std::string name;
  PagedKvLayout src, dst;
  uint32_t layers = 1, heads = 0, src_head_begin = 0, dst_head_begin = 0;
  uint64_t tokens = 0;
};

PagedKvLayout Layout(v1::LayoutOrder order, uint32_t layers, uint32_t parts, uint32_t blocks,
                     uint32_t tpb, uint32_t heads, uint32_t head_dim, v1::DType dtype,
                     uint64_t offset = 0) {
  PagedKvLayout l;
  l.set_num_layers(layers);
  l.set_num_parts(parts);
  l.set_num_blocks(blocks);
  l.set_tokens_per_block(tpb);
  l.set_num_heads(heads);
  l.set_head_dim(head_dim);
  l.set_dtype(dtype);
  l.set_order(order);
  l.set_offset_bytes(offset);
  return l;
}

uint64_t Extent(const PagedKvLayout& p) {
  absl::StatusOr<planner::KvLayout> k = planner::ResolveLayout(p, UINT64_MAX, "");
  if (!k.ok()) {
    std::fprintf(stderr, "bad layout %s: %s\n", p.ShortDebugString().c_str(),
                 k.status().ToString().c_str());
    std::exit(1);
  }
  const uint64_t vec = uint64_t{p.head_dim()} * k->dtype_bytes;
  return k->offset + k->layer_stride * (p.num_layers() - 1) + k->part_stride * (p.num_parts() - 1) +
         k->block_stride * (p.num_blocks() - 1) + k->token_stride * (p.tokens_per_block() - 1) +
         k->head_stride * (p.num_heads() - 1) + vec;
}

std::vector<uint32_t> Scattered(uint32_t pool, uint32_t n, std::mt19937_64& rng) {
  std::vector<uint32_t> ids(pool);
  std::iota(ids.begin(), ids.end(), 0u);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n);
  return ids;
}

std::string PathOf(const kernels::DevicePlan& p) {
  if (p.piece_bytes != 0) return absl::StrCat("warp pieces ", p.piece_bytes, " B");
  if (p.segments) return absl::StrCat("chunk segments");
  return absl::StrCat("slab, ", p.access_bytes, " B accesses");
}

// The segment path's forms (DevicePlan::segment_form): registers (6), bulk-staged with 3 stages,
// one bulk copy per piece (103), and split registers (whole units as one stream, partial units
// per lane) with 4 and 6 whole units per lane and round (204, 206; two segments per lane, 214 /
// 216, were slower everywhere when measured and are not timed here).
constexpr kernels::SegmentForm kSegmentForms[] = {
    kernels::SegmentForm::kRegisters, kernels::SegmentForm::kBulk3, kernels::SegmentForm::kSplit4,
    kernels::SegmentForm::kSplit6};
constexpr int kNumForms = sizeof(kSegmentForms) / sizeof(kSegmentForms[0]);

struct Result {
  std::string name, path, plan;
  double gbps32 = 0, gbps132 = 0;  // medians of spread32 / spread132
  gpu_bench::Spread spread32, spread132;
  double slab32 = 0;    // the slab path at 32 CTAs (whatever Upload chose)
  double pieces32 = 0;  // the warp path at 32 CTAs, where PieceBytesFor allows it
  // kSegmentForms at 32 / 132 CTAs, in that order.
  double form32[kNumForms] = {}, form132[kNumForms] = {};
  bool ok = false;
  uint64_t bytes = 0;
};

Result RunCase(const Case& c, std::mt19937_64& rng, int reps) {
  Result r;
  r.name = c.name;
  const uint32_t src_tpb = c.src.tokens_per_block(), dst_tpb = c.dst.tokens_per_block();
  const uint32_t src_need = static_cast<uint32_t>((c.tokens + src_tpb - 1) / src_tpb);
  const uint32_t dst_need = static_cast<uint32_t>((c.tokens + dst_tpb - 1) / dst_tpb);
  v1::TransferSpec spec;
  spec.mutable_src()->set_region_id(1);
  spec.mutable_dst()->set_region_id(2);
  spec.set_num_layers(c.layers);
  spec.set_num_heads(c.heads);
  spec.set_num_tokens(c.tokens);
  spec.mutable_src()->set_head_begin(c.src_head_begin);
  spec.mutable_dst()->set_head_begin(c.dst_head_begin);
  for (uint32_t id : Scattered(c.src.num_blocks(), src_need, rng)) {
    spec.mutable_src()->mutable_block_ids_le32()->append(reinterpret_cast<const char*>(&id), 4);
  }
  for (uint32_t id : Scattered(c.dst.num_blocks(), dst_need, rng)) {
    spec.mutable_dst()->mutable_block_ids_le32()->append(reinterpret_cast<const char*>(&id), 4);
  }
  const uint64_t src_size = Extent(c.src), dst_size = Extent(c.dst);
  planner::RegionView src{src_size, false, true, *planner::ResolveLayout(c.src, src_size, "")};
  planner::RegionView dst{dst_size, true, true, *planner::ResolveLayout(c.dst, dst_size, "")};
  planner::PlanOptions options;
  options.tile_bytes = 1 << 20;
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(spec, src, dst, options);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.name.c_str(), plan.status().ToString().c_str());
    r.path = "plan refused";
    return r;
  }
  r.plan = plan->Describe();
  r.bytes = plan->bytes_total();

  std::vector<uint8_t> host_src(src_size);
  for (size_t i = 0; i < host_src.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(host_src.data() + i, &v, std::min<size_t>(8, host_src.size() - i));
  }
  std::vector<uint8_t> want(dst_size, 0xAB);
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    planner::ExecuteTileHost(*plan, t, host_src.data(), want.data());
  }
  uint8_t* src_dev = static_cast<uint8_t*>(AllocOn(g_pair.src, src_size));
  uint8_t* dst_dev = static_cast<uint8_t*>(AllocOn(g_pair.dst, dst_size));
  gpu_test::CopyToDevice(src_dev, host_src.data(), src_size);
  gpu_test::Memset(dst_dev, 0xAB, dst_size);
  absl::StatusOr<kernels::DevicePlanBuffer> dp = kernels::DevicePlanBuffer::Upload(
      plan->header(), plan->src_blocks().data(), plan->dst_blocks().data(),
      reinterpret_cast<uint64_t>(src_dev), reinterpret_cast<uint64_t>(dst_dev), nullptr);
  if (!dp.ok()) {
    std::fprintf(stderr, "%s: upload: %s\n", c.name.c_str(), dp.status().ToString().c_str());
    return r;
  }
  r.path = PathOf(dp->plan());
  auto launch = [&](int ctas) {
    absl::Status s = kernels::LaunchKvCopy(dp->plan(), 0, plan->num_tiles(), ctas, nullptr);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), s.ToString().c_str());
      std::exit(1);
    }
  };
  launch(32);
  gpu_test::Sync();
  std::vector<uint8_t> got(dst_size);
  gpu_test::CopyToHost(got.data(), dst_dev, dst_size);
  r.ok = got == want;
  if (!r.ok) {
    size_t first = 0;
    while (got[first] == want[first]) ++first;
    std::fprintf(stderr, "%s: MISMATCH first at dst byte %zu (kernel %d, host twin %d)\n",
                 c.name.c_str(), first, got[first], want[first]);
  }
  // GB/s of each of `reps` launches (after one warm-up).
  auto runs = [&](const kernels::DevicePlan& p, int ctas) {
    std::vector<double> gbps;
    gpu_test::Timer timer;
    auto go = [&] {
      absl::Status s =
          kernels::LaunchKvCopyForm(p, 0, plan->num_tiles(), ctas, nullptr, p.segment_form);
      if (!s.ok()) std::exit(1);
    };
    go();  // warm
    for (int i = 0; i < reps; ++i) {
      timer.Start();
      go();
      gbps.push_back(r.bytes / (timer.StopMs() / 1e3) / 1e9);
    }
    return gpu_bench::SpreadOf(gbps);
  };
  auto time = [&](const kernels::DevicePlan& p, int ctas) { return runs(p, ctas).median; };
  r.spread32 = runs(dp->plan(), 32);
  r.spread132 = runs(dp->plan(), 132);
  r.gbps32 = r.spread32.median;
  r.gbps132 = r.spread132.median;
  // The three inner loops on the same plan, at the daemon's default budget, and the segment
  // path's forms at 32 and 132 CTAs on every chunked plan (whichever path Upload chose).
  kernels::DevicePlan alt = dp->plan();
  alt.piece_bytes = 0;
  alt.segments = false;
  r.slab32 = time(alt, 32);
  const bool chunked = plan->header().chunk_kind != 0;  // not kBytes
  if (chunked) {
    alt.segments = true;
    for (int i = 0; i < kNumForms; ++i) {
      alt.segment_form = kSegmentForms[i];
      r.form32[i] = time(alt, 32);
      r.form132[i] = time(alt, 132);
    }
    alt.segment_form = kernels::SegmentForm::kDefault;
  }
  alt.segments = false;
  alt.piece_bytes = kernels::PieceBytesFor(plan->header(), dp->plan().access_bytes);
  if (alt.piece_bytes != 0) r.pieces32 = time(alt, 32);
  // Every segment form byte for byte against the host twin (destination poisoned each time), at
  // 32 CTAs and at 132; the variants timed above wrote the same bytes.
  if (r.ok && chunked) {
    for (kernels::SegmentForm form : kSegmentForms) {
      for (int ctas : {32, 132}) {
        gpu_test::Memset(dst_dev, 0xAB, dst_size);
        kernels::DevicePlan p = dp->plan();
        p.piece_bytes = 0;
        p.segments = true;
        p.segment_form = form;
        if (!kernels::LaunchKvCopyForm(p, 0, plan->num_tiles(), ctas, nullptr, form).ok()) {
          std::exit(1);
        }
        gpu_test::Sync();
        gpu_test::CopyToHost(got.data(), dst_dev, dst_size);
        if (got != want) {
          std::fprintf(stderr, "%s: MISMATCH on segment form %d at %d CTAs\n", c.name.c_str(),
                       static_cast<int>(form), ctas);
          r.ok = false;
        }
      }
    }
  }
  gpu_test::DeviceFree(src_dev);
  gpu_test::DeviceFree(dst_dev);
  return r;
}

// Explicit padded strides: [block][token][head] with `pad` bytes after every head vector, token
// and block (a side that is nowhere near a serving engine's packing).
PagedKvLayout Padded(uint32_t layers, uint32_t blocks, uint32_t tpb, uint32_t heads,
                     uint32_t head_dim, uint64_t pad) {
  PagedKvLayout l =
      Layout(v1::LAYOUT_ORDER_UNSPECIFIED, layers, 2, blocks, tpb, heads, head_dim, v1::DTYPE_BF16);
  const uint64_t vec = uint64_t{head_dim} * 2;
  const uint64_t head_stride = vec + pad;
  const uint64_t token_stride = head_stride * heads + pad;
  const uint64_t block_stride = token_stride * tpb + pad;
  const uint64_t part_stride = block_stride * blocks;
  l.set_head_stride(head_stride);
  l.set_token_stride(token_stride);
  l.set_block_stride(block_stride);
  l.set_part_stride(part_stride);
  l.set_layer_stride(part_stride * 2);
  return l;
}

std::vector<Case> NamedCases(bool quick) {
  using v1::DTYPE_BF16;
  using v1::DTYPE_UINT8;
  const auto NHD = v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD;
  const auto HND = v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND;
  const auto BNHD = v1::LAYOUT_ORDER_BLOCK_LAYER_PART_NHD;
  // ~256 MiB per case (quick: ~64 MiB): 8 KV heads x 128 x bf16 = 2 KiB per token and part.
  const uint32_t L = 2;
  const uint64_t tokens = quick ? 8192 : 32768;
  const uint32_t pool16 = static_cast<uint32_t>(2 * tokens / 16);
  std::vector<Case> cs;
  auto add = [&](std::string name, PagedKvLayout s, PagedKvLayout d, uint32_t heads,
                 uint32_t sh = 0, uint32_t dh = 0, uint64_t t = 0) {
    Case c{std::move(name), std::move(s), std::move(d), L, heads, sh, dh, t == 0 ? tokens : t};
    cs.push_back(std::move(c));
  };
  // The aligned serving layout: whole NHD blocks, same layout both sides.
  add("aligned: NHD16 -> NHD16 (baseline)", Layout(NHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16),
      Layout(NHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16), 8);
  // MLA: one joint latent "head" (576 or 656 bytes), 64-token blocks on one side, 16 on the other.
  const uint64_t mla_tokens = tokens * 4;  // ~ the same bytes
  const uint32_t mla64 = static_cast<uint32_t>(2 * mla_tokens / 64), mla16 = mla64 * 4;
  add("MLA 576 B, 64 -> 16 tokens/block", Layout(NHD, L, 1, mla64, 64, 1, 288, DTYPE_BF16),
      Layout(NHD, L, 1, mla16, 16, 1, 288, DTYPE_BF16), 1, 0, 0, mla_tokens);
  add("MLA 656 B, 64 -> 16 tokens/block", Layout(NHD, L, 1, mla64, 64, 1, 328, DTYPE_BF16),
      Layout(NHD, L, 1, mla16, 16, 1, 328, DTYPE_BF16), 1, 0, 0, mla_tokens);
  add("MLA 576 B, same blocks", Layout(NHD, L, 1, mla64, 64, 1, 288, DTYPE_BF16),
      Layout(NHD, L, 1, mla64, 64, 1, 288, DTYPE_BF16), 1, 0, 0, mla_tokens);
  // 657-byte vectors (uint8) at odd offsets on both sides, HND -> NHD.
  const uint64_t odd_tokens = tokens * 3;
  const uint32_t odd_pool = static_cast<uint32_t>(2 * odd_tokens / 16);
  add("657 B vectors, offsets 1 / 3, HND -> NHD",
      Layout(HND, L, 2, odd_pool, 16, 1, 657, DTYPE_UINT8, 1),
      Layout(NHD, L, 2, odd_pool, 16, 1, 657, DTYPE_UINT8, 3), 1, 0, 0, odd_tokens);
  add("657 B vectors, offsets 1 / 3, 16 -> 32 tokens/block",
      Layout(NHD, L, 2, odd_pool, 16, 1, 657, DTYPE_UINT8, 1),
      Layout(NHD, L, 2, odd_pool / 2, 32, 1, 657, DTYPE_UINT8, 3), 1, 0, 0, odd_tokens);
  // bf16 at an odd offset (2 mod 16) on the destination.
  add("bf16 offset 6, NHD16 -> NHD16", Layout(NHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16),
      Layout(NHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16, 6), 8);
  // Block-major <-> padded explicit strides.
  add("block-major NHD -> padded strides (+16 B)",
      Layout(BNHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16), Padded(L, pool16, 16, 8, 128, 16), 8);
  add("padded strides (+2 B) -> block-major NHD", Padded(L, pool16, 16, 8, 128, 2),
      Layout(BNHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16), 8);
  // TP1 -> TP2/4/8: a slice of the 8 heads into a pool of 8/TP heads (the last slice).
  for (uint32_t tp : {2u, 4u, 8u}) {
    const uint32_t h = 8 / tp;
    add(absl::StrCat("TP1 -> TP", tp, " heads ", 8 - h, "..7"),
        Layout(NHD, L, 2, pool16 / tp * tp, 16, 8, 128, DTYPE_BF16),
        Layout(NHD, L, 2, pool16, 16, h, 128, DTYPE_BF16), h, 8 - h, 0, tokens);
  }
  // HND <-> NHD with decode blocks larger and smaller.
  add("NHD16 -> HND32", Layout(NHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16),
      Layout(HND, L, 2, pool16 / 2, 32, 8, 128, DTYPE_BF16), 8);
  add("NHD16 -> HND8", Layout(NHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16),
      Layout(HND, L, 2, pool16 * 2, 8, 8, 128, DTYPE_BF16), 8);
  add("HND32 -> NHD16", Layout(HND, L, 2, pool16 / 2, 32, 8, 128, DTYPE_BF16),
      Layout(NHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16), 8);
  add("HND16 -> NHD16", Layout(HND, L, 2, pool16, 16, 8, 128, DTYPE_BF16),
      Layout(NHD, L, 2, pool16, 16, 8, 128, DTYPE_BF16), 8);
  return cs;
}

// A randomized set beside the named one (the target: "every layout of a randomized and a named
// set"): random vector sizes (odd ones too) and dtypes, head counts and head sub-ranges, block
// sizes and orders on each side, byte offsets, sometimes padded explicit strides; ~64 MiB each
// (quick: ~16 MiB).
std::vector<Case> RandomCases(std::mt19937_64& rng, int n, bool quick) {
  using v1::DTYPE_BF16;
  using v1::DTYPE_UINT8;
  const v1::LayoutOrder orders[] = {v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD,
                                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND,
                                    v1::LAYOUT_ORDER_BLOCK_LAYER_PART_NHD};
  const uint32_t tpbs[] = {8, 16, 32, 64};
  const uint32_t L = 2;
  std::vector<Case> cs;
  for (int k = 0; k < n; ++k) {
    const bool bytes = rng() % 3 == 0;  // uint8 vectors of any size, else bf16
    const uint32_t head_dim =
        bytes ? 64 + static_cast<uint32_t>(rng() % 700)
              : 32 * (1 + static_cast<uint32_t>(rng() % 8)) + (rng() % 2 ? 8 : 0);
    const uint32_t vec = bytes ? head_dim : 2 * head_dim;
    const uint32_t src_heads = 1 + static_cast<uint32_t>(rng() % 8);
    const uint32_t heads = 1 + static_cast<uint32_t>(rng() % src_heads);
    const uint32_t dst_heads = heads + static_cast<uint32_t>(rng() % 3);
    const uint32_t sh = static_cast<uint32_t>(rng() % (src_heads - heads + 1));
    const uint32_t dh = static_cast<uint32_t>(rng() % (dst_heads - heads + 1));
    const uint32_t stpb = tpbs[rng() % 4], dtpb = tpbs[rng() % 4];
    const uint64_t per_token = uint64_t{L} * 2 * heads * vec;
    const uint64_t tokens =
        std::max<uint64_t>(64, (quick ? (16ull << 20) : (64ull << 20)) / per_token);
    const uint32_t sblocks = static_cast<uint32_t>(2 * ((tokens + stpb - 1) / stpb));
    const uint32_t dblocks = static_cast<uint32_t>(2 * ((tokens + dtpb - 1) / dtpb));
    const v1::DType dt = bytes ? DTYPE_UINT8 : DTYPE_BF16;
    const uint64_t soff = rng() % 4 == 0 ? rng() % 16 : 0, doff = rng() % 3 == 0 ? rng() % 16 : 0;
    PagedKvLayout s = Layout(orders[rng() % 3], L, 2, sblocks, stpb, src_heads, head_dim, dt, soff);
    PagedKvLayout d = Layout(orders[rng() % 3], L, 2, dblocks, dtpb, dst_heads, head_dim, dt, doff);
    std::string padded;
    if (!bytes && rng() % 4 == 0) {
      const uint64_t pad = 2 * (1 + rng() % 8);
      if (rng() % 2 == 0) {
        s = Padded(L, sblocks, stpb, src_heads, head_dim, pad);
      } else {
        d = Padded(L, dblocks, dtpb, dst_heads, head_dim, pad);
      }
      padded = absl::StrCat(", padded +", pad);
    }
    std::string name = absl::StrFormat(
        "random %d: %u B x %u of %u -> %u heads (at %u / %u), %u -> %u tok/blk, orders %d -> %d, "
        "offsets %u / %u%s",
        k, vec, heads, src_heads, dst_heads, sh, dh, stpb, dtpb, static_cast<int>(s.order()),
        static_cast<int>(d.order()), static_cast<unsigned>(soff), static_cast<unsigned>(doff),
        padded);
    cs.push_back(Case{std::move(name), std::move(s), std::move(d), L, heads, sh, dh, tokens});
  }
  return cs;
}

}  // namespace
}  // namespace kvrail

int main(int argc, char** argv) {
  using namespace kvrail;
  if (gpu_test::DeviceCount() == 0) {
    std::printf("no CUDA device\n");
    return 1;
  }
  g_pair = gpu_bench::TakeGpuPair(&argc, argv);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::printf("layout_bench on %s (%d SMs), %s, kernel only (on GPU%d)\n",
              gpu_test::DeviceName(g_pair.src).c_str(), gpu_test::SmCount(g_pair.src),
              g_pair.Name().c_str(), g_pair.src);
  std::mt19937_64 rng(19);
  std::vector<Result> results;
  std::vector<Case> cases = NamedCases(quick);
  if (const char* n = std::getenv("LAYOUT_RANDOM"); n != nullptr && std::atoi(n) > 0) {
    std::mt19937_64 layout_rng(1919);
    for (Case& c : RandomCases(layout_rng, std::atoi(n), quick)) cases.push_back(std::move(c));
  }
  if (const char* only = std::getenv("LAYOUT_ONLY"); only != nullptr && *only != '\0') {
    std::vector<bool> keep(cases.size(), false);
    keep[0] = true;
    for (const char* p = only; *p != '\0';) {
      char* e = nullptr;
      const long i = std::strtol(p, &e, 10);
      if (e == p) break;
      if (i >= 0 && static_cast<size_t>(i) < cases.size()) keep[i] = true;
      p = *e == ',' ? e + 1 : e;
    }
    std::vector<Case> kept;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (keep[i]) kept.push_back(std::move(cases[i]));
    }
    cases = std::move(kept);
  }
  for (const Case& c : cases) {
    results.push_back(RunCase(c, rng, quick ? 5 : 20));
    const Result& r = results.back();
    std::string forms;
    for (int i = 0; i < kNumForms; ++i) {
      forms += absl::StrFormat(" | %d: %.1f / %.1f", static_cast<int>(kSegmentForms[i]),
                               r.form32[i], r.form132[i]);
    }
    std::printf("  %-48s %s | %s | %.1f / %.1f GB/s | slab %.1f%s | %s\n", r.name.c_str(),
                r.ok ? "bytes OK" : "MISMATCH", r.path.c_str(), r.gbps32, r.gbps132, r.slab32,
                forms.c_str(), r.plan.c_str());
    std::fflush(stdout);
  }
  const double base32 = results.front().gbps32, base132 = results.front().gbps132;
  auto pct = [](double v, double base) {
    return v > 0 ? absl::StrFormat("%.1f (%.0f%%)", v, 100 * v / base) : std::string("-");
  };
  // Segment forms, by DevicePlan::segment_form: 6 registers, 103 bulk copies (3 stages), 2UP
  // split registers with U whole units per lane and round and P + 1 segments per lane.
  std::string head =
      "\n| layout | MiB | kernel path (chosen) | bytes | GB/s at 32 CTAs, shipped default: median "
      "(min-max) | vs aligned | GB/s at 132 CTAs, tuned: median (min-max) | vs aligned | 32 CTAs: "
      "slab / pieces |";
  std::string rule = "|---|---|---|---|---|---|---|---|---|";
  for (kernels::SegmentForm form : kSegmentForms) {
    head += absl::StrFormat(" segment form %d: 32 / 132 |", static_cast<int>(form));
    rule += "---|";
  }
  std::printf("%s\n%s\n", head.c_str(), rule.c_str());
  int failed = 0;
  for (const Result& r : results) {
    if (r.path == "plan refused") continue;  // the planner's call, not a kernel result
    failed += r.ok ? 0 : 1;
    std::string forms;
    for (int i = 0; i < kNumForms; ++i) {
      forms += absl::StrFormat(" %s / %s |", pct(r.form32[i], base32), pct(r.form132[i], base132));
    }
    const std::string slab = absl::StrFormat(
        "%.1f / %s", r.slab32, r.pieces32 > 0 ? absl::StrFormat("%.1f", r.pieces32) : "-");
    std::printf("| %s | %.0f | %s | %s | %s | %.0f%% | %s | %.0f%% | %s |%s\n", r.name.c_str(),
                r.bytes / 1048576.0, r.path.c_str(), r.ok ? "OK" : "MISMATCH",
                gpu_bench::Cell(r.spread32).c_str(), 100 * r.gbps32 / base32,
                gpu_bench::Cell(r.spread132).c_str(), 100 * r.gbps132 / base132, slab.c_str(),
                forms.c_str());
  }
  return failed == 0 ? 0 : 1;
}
