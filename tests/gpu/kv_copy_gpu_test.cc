// GPU test of the fused kernel (runs on the lent GPU machine, not in CI): random layouts, block
// tables and conversions, the kernel's result compared byte for byte with the host twin (which
// the unit tests compare with a naive reference), destinations poisoned so stray writes show;
// device -> mapped pinned host too. Ends with a small bandwidth print.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/kv_copy.h"
#include "kernels/kv_copy_forms.h"
#include "kernels/plan_image.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/gpu/gpu_util.h"

namespace kvrail {
namespace {

// Cases whose plan took the kernel's warp path (DevicePlan::piece_bytes set), and its segment
// path (DevicePlan::segments).
int g_warp_path_cases = 0;
int g_segment_path_cases = 0;

using planner::Plan;
constexpr uint8_t kPoison = 0xAB;

bool HaveGpu() { return gpu_test::HaveGpus(1, gpu_test::DeviceCount()); }

// Runs `c` on the GPU (dst in device memory or mapped pinned host memory, bases shifted by
// `misalign` bytes to exercise narrow accesses) and compares with the host twin.
// `form`: the segment path's form for plans on it (kernels/segment_math.h: SegmentForm; the
// benchmark forms launch through kernels/kv_copy_forms.h).
void RunCase(const planner::testing::RandomCase& c, std::mt19937_64& rng, bool dst_on_host,
             uint32_t misalign, kernels::SegmentForm form = kernels::SegmentForm::kDefault,
             bool force_segments = false) {
  INFO(c.ToString());
  absl::StatusOr<Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  INFO(plan->Describe() << " dst_on_host " << dst_on_host << " misalign " << misalign);

  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> want(c.dst.size_bytes, kPoison);
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    planner::ExecuteTileHost(*plan, t, src.data(), want.data());
  }

  uint8_t* src_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(src.size() + 16));
  gpu_test::CopyToDevice(src_dev + misalign, src.data(), src.size());
  uint8_t* dst_host = nullptr;
  uint8_t* dst_dev = nullptr;
  const size_t dst_alloc = want.size() + 16;
  if (dst_on_host) {
    void* mapped = nullptr;
    dst_host = static_cast<uint8_t*>(gpu_test::HostAllocMapped(dst_alloc, &mapped));
    std::fill(dst_host, dst_host + dst_alloc, kPoison);
    dst_dev = static_cast<uint8_t*>(mapped);
  } else {
    dst_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(dst_alloc));
    gpu_test::Memset(dst_dev, kPoison, dst_alloc);
  }

  absl::StatusOr<kernels::DevicePlanBuffer> dp = kernels::DevicePlanBuffer::Upload(
      plan->header(), plan->src_blocks().data(), plan->dst_blocks().data(),
      reinterpret_cast<uint64_t>(src_dev + misalign),
      reinterpret_cast<uint64_t>(dst_dev + misalign), nullptr);
  REQUIRE(dp.ok());
  kernels::DevicePlan launch_plan = dp->plan();
  launch_plan.segment_form = form;
  if (force_segments && plan->header().chunk_kind != 0) {  // any chunked plan (not kBytes)
    launch_plan.piece_bytes = 0;
    launch_plan.segments = true;
  }
  if (dp->plan().piece_bytes != 0) ++g_warp_path_cases;
  if (dp->plan().piece_bytes == 0 && dp->plan().segments) ++g_segment_path_cases;
  // Tiles in a few random ranges, each with a random CTA count.
  uint32_t t = 0;
  while (t < plan->num_tiles()) {
    const uint32_t n =
        1 + static_cast<uint32_t>(rng() % std::max<uint32_t>(1, plan->num_tiles() / 2));
    const uint32_t end = std::min(plan->num_tiles(), t + n);
    const int ctas = 1 + static_cast<int>(rng() % 40);
    const int threads = 32 * (1 + static_cast<int>(rng() % 16));
    REQUIRE(kernels::LaunchKvCopyForm(launch_plan, t, end, ctas, nullptr, form, threads).ok());
    t = end;
  }
  gpu_test::Sync();

  std::vector<uint8_t> got(dst_alloc);
  if (dst_on_host) {
    std::copy(dst_host, dst_host + dst_alloc, got.begin());
  } else {
    gpu_test::CopyToHost(got.data(), dst_dev, dst_alloc);
  }
  for (uint32_t k = 0; k < misalign; ++k) REQUIRE(got[k] == kPoison);
  for (size_t k = misalign + want.size(); k < dst_alloc; ++k) REQUIRE(got[k] == kPoison);
  const bool same = std::equal(want.begin(), want.end(), got.begin() + misalign);
  if (!same) {
    size_t first = 0;
    while (want[first] == got[misalign + first]) ++first;
    FAIL("first mismatch at dst byte " << first << ": kernel " << int(got[misalign + first])
                                       << ", host twin " << int(want[first]));
  }
  gpu_test::DeviceFree(src_dev);
  if (dst_on_host) {
    gpu_test::HostFree(dst_host);
  } else {
    gpu_test::DeviceFree(dst_dev);
  }
}

// The segment forms the cases alternate over (every form a plan may be given, and variants).
using kernels::SegmentForm;
constexpr SegmentForm kSegmentForms[] = {
    SegmentForm::kDefault, SegmentForm::kRegisters, SegmentForm::kBulk3,    SegmentForm::kBulk2,
    SegmentForm::kSplit6,  SegmentForm::kSplit4,    SegmentForm::kSplit4x2, SegmentForm::kSplit6x2};
SegmentForm SegmentFormOf(int n) { return kSegmentForms[n % 8]; }

}  // namespace

TEST_CASE("kernel == host twin on random paged transfers (device -> device)") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(1129);
  planner::testing::RandomLimits big;
  big.max_blocks = 64;
  big.max_head_dim = 64;
  big.max_heads = 8;
  big.max_tpb = 32;
  for (int n = 0; n < 300; ++n) {
    const bool large = n % 3 == 0;
    RunCase(planner::testing::RandomPagedCase(rng, large ? big : planner::testing::RandomLimits{}),
            rng, /*dst_on_host=*/false, n % 5 == 0 ? static_cast<uint32_t>(rng() % 16) : 0,
            /*form=*/SegmentFormOf(n),
            /*force_segments=*/n % 3 == 1);
  }
}

TEST_CASE("kernel == host twin on serving layouts (mostly the warp path)") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(2911);
  const int before = g_warp_path_cases;
  for (int n = 0; n < 120; ++n) {
    RunCase(planner::testing::RandomServingCase(rng), rng, /*dst_on_host=*/n % 6 == 5,
            n % 4 == 0 ? static_cast<uint32_t>(rng() % 16) : 0,
            /*form=*/kernels::SegmentForm::kDefault,
            /*force_segments=*/n % 5 == 2);
  }
  CHECK(g_warp_path_cases - before >= 20);  // misaligned bases take the slab path
}

TEST_CASE("kernel == host twin on random bytes transfers") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(31);
  for (int n = 0; n < 60; ++n) {
    planner::testing::RandomCase c = planner::testing::RandomBytesCase(rng, 1 << 22);
    // The generator's 1-byte tiles make up to 4M tiles, over the planner's cap (max_tiles, 1M
    // per transfer: refused, not a kernel case): then the smallest multiple of 16 bytes under
    // the cap (the planner rounds tile sizes down to the access width, at most 16).
    const uint64_t cap = c.options.max_tiles;
    const uint64_t bytes = c.spec.num_bytes();
    if ((bytes + c.options.tile_bytes - 1) / c.options.tile_bytes > cap / 2) {
      c.options.tile_bytes = ((bytes + cap - 1) / cap + 15) / 16 * 16;
    }
    RunCase(c, rng, n % 4 == 0, n % 3 == 0 ? static_cast<uint32_t>(rng() % 16) : 0);
  }
}

// Narrow layouts (the segment path), small: odd vector sizes at odd offsets, bf16 at
// an odd offset, padded strides, head sub-ranges; random tile sizes (odd ones too), base
// misalignments, CTA counts and block sizes.
kvrail::v1::PagedKvLayout NarrowLayout(kvrail::v1::LayoutOrder order, uint32_t blocks, uint32_t tpb,
                                       uint32_t heads, uint32_t head_dim, kvrail::v1::DType dtype,
                                       uint64_t offset, uint64_t pad) {
  kvrail::v1::PagedKvLayout l;
  l.set_num_layers(2);
  l.set_num_parts(2);
  l.set_num_blocks(blocks);
  l.set_tokens_per_block(tpb);
  l.set_num_heads(heads);
  l.set_head_dim(head_dim);
  l.set_dtype(dtype);
  l.set_offset_bytes(offset);
  if (pad == 0) {
    l.set_order(order);
    return l;
  }
  // Explicit strides, `pad` bytes after every head vector, token and block.
  const uint64_t vec = uint64_t{head_dim} * (dtype == kvrail::v1::DTYPE_UINT8 ? 1 : 2);
  const uint64_t head_stride = vec + pad, token_stride = head_stride * heads + pad;
  const uint64_t block_stride = token_stride * tpb + pad, part_stride = block_stride * blocks;
  l.set_head_stride(head_stride);
  l.set_token_stride(token_stride);
  l.set_block_stride(block_stride);
  l.set_part_stride(part_stride);
  l.set_layer_stride(2 * part_stride);
  return l;
}

TEST_CASE("kernel == host twin on narrow layouts (odd sizes, offsets, padded strides)") {
  if (!HaveGpu()) return;
  using kvrail::v1::DTYPE_BF16;
  using kvrail::v1::DTYPE_UINT8;
  const auto NHD = kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD;
  const auto HND = kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND;
  const auto BNHD = kvrail::v1::LAYOUT_ORDER_BLOCK_LAYER_PART_NHD;
  std::mt19937_64 rng(1901);
  const int before = g_segment_path_cases;
  for (int n = 0; n < 80; ++n) {
    const uint32_t blocks = 48, tokens = 16 * (1 + static_cast<uint32_t>(rng() % 20)) - rng() % 16;
    kvrail::v1::PagedKvLayout s, d;
    uint32_t heads = 1, sh = 0, dh = 0;
    switch (n % 5) {
      case 0:  // 657-byte vectors (or another odd size), odd offsets, HND -> NHD
      case 1: {
        const uint32_t dim = 600 + static_cast<uint32_t>(rng() % 100);
        s = NarrowLayout(n % 5 == 0 ? HND : NHD, blocks, 16, 2, dim, DTYPE_UINT8, 1 + rng() % 15,
                         0);
        d = NarrowLayout(NHD, blocks, n % 5 == 0 ? 16 : 32, 2, dim, DTYPE_UINT8, 1 + rng() % 15, 0);
        heads = 2;
        break;
      }
      case 2:  // bf16 at an odd offset (2 mod 4)
        s = NarrowLayout(NHD, blocks, 16, 4, 128, DTYPE_BF16, 0, 0);
        d = NarrowLayout(NHD, blocks, 16, 4, 128, DTYPE_BF16, 2 + 4 * (rng() % 4), 0);
        heads = 4;
        break;
      case 3:  // padded strides (+2 B) -> block-major
        s = NarrowLayout(NHD, blocks, 16, 4, 128, DTYPE_BF16, 0, 2);
        d = NarrowLayout(BNHD, blocks, 16, 4, 128, DTYPE_BF16, 0, 0);
        heads = 4;
        break;
      default:  // a head sub-range at an odd offset, bf16, into fewer heads
        s = NarrowLayout(NHD, blocks, 16, 8, 64, DTYPE_BF16, 6, 0);
        d = NarrowLayout(HND, blocks, 8, 3, 64, DTYPE_BF16, 10, 2);
        heads = 3;
        sh = 1 + static_cast<uint32_t>(rng() % 5);
        dh = 0;
        break;
    }
    planner::testing::RandomCase c;
    c.src_layout = s;
    c.dst_layout = d;
    c.spec.mutable_src()->set_region_id(1);
    c.spec.mutable_dst()->set_region_id(2);
    c.spec.set_num_layers(1 + static_cast<uint32_t>(rng() % 2));
    c.spec.set_num_heads(heads);
    c.spec.set_num_tokens(tokens);
    c.spec.mutable_src()->set_head_begin(sh);
    c.spec.mutable_dst()->set_head_begin(dh);
    std::vector<uint32_t> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0u);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (uint32_t j = 0; j < (tokens + s.tokens_per_block() - 1) / s.tokens_per_block(); ++j) {
      c.spec.mutable_src()->add_block_ids(ids[j]);
    }
    std::shuffle(ids.begin(), ids.end(), rng);
    for (uint32_t j = 0; j < (tokens + d.tokens_per_block() - 1) / d.tokens_per_block(); ++j) {
      c.spec.mutable_dst()->add_block_ids(ids[j]);
    }
    const uint64_t big = uint64_t{1} << 26;
    absl::StatusOr<planner::KvLayout> ks = planner::ResolveLayout(s, big, "");
    absl::StatusOr<planner::KvLayout> kd = planner::ResolveLayout(d, big, "");
    REQUIRE(ks.ok());
    REQUIRE(kd.ok());
    // Region sizes: up to the last byte either layout reaches (+ slack).
    auto extent = [](const kvrail::v1::PagedKvLayout& p, const planner::KvLayout& k) {
      const uint64_t vec = uint64_t{p.head_dim()} * (p.dtype() == kvrail::v1::DTYPE_UINT8 ? 1 : 2);
      return k.offset + k.layer_stride * (p.num_layers() - 1) +
             k.part_stride * (p.num_parts() - 1) + k.block_stride * (p.num_blocks() - 1) +
             k.token_stride * (p.tokens_per_block() - 1) + k.head_stride * (p.num_heads() - 1) +
             vec;
    };
    const uint64_t ss = extent(s, *ks) + rng() % 32, ds = extent(d, *kd) + rng() % 32;
    c.src = planner::RegionView{ss, false, true, *planner::ResolveLayout(s, ss, "")};
    c.dst = planner::RegionView{ds, true, true, *planner::ResolveLayout(d, ds, "")};
    static const uint64_t kTiles[] = {100, 1000, 4096, 5000, 65536, 1 << 20};
    c.options.tile_bytes = kTiles[rng() % 6];
    RunCase(c, rng, /*dst_on_host=*/n % 7 == 3, static_cast<uint32_t>(rng() % 16),
            /*form=*/SegmentFormOf(n));
  }
  CHECK(g_segment_path_cases - before >= 40);
}

TEST_CASE("kernel == host twin into mapped pinned host memory") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(77);
  for (int n = 0; n < 60; ++n) {
    RunCase(planner::testing::RandomPagedCase(rng), rng, /*dst_on_host=*/true, 0);
  }
}

// A plan buffer kept for its shape and rewritten with other ids (DevicePlanBuffer::UploadBlockIds,
// what the CUDA engine's warm plans do): the source's ids drawn again and the destination's
// shuffled (the same shape), rewritten through pinned staging and straight from the tables in
// turn; each launch after a rewrite moves that plan's blocks, compared whole with the host twin
// run over every plan so far in order.
TEST_CASE("a kept plan buffer with other block ids (UploadBlockIds) == host twin") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(2027);
  void* staging_dev = nullptr;
  const size_t staging_bytes = 1 << 20;
  void* staging = gpu_test::HostAllocMapped(staging_bytes, &staging_dev);
  for (int n = 0; n < 60; ++n) {
    planner::testing::RandomCase c = n % 2 == 0 ? planner::testing::RandomPagedCase(rng)
                                                : planner::testing::RandomServingCase(rng);
    INFO(c.ToString());
    std::vector<uint8_t> src(c.src.size_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> want(c.dst.size_bytes, kPoison);
    uint8_t* src_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(src.size()));
    gpu_test::CopyToDevice(src_dev, src.data(), src.size());
    uint8_t* dst_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(want.size()));
    gpu_test::Memset(dst_dev, kPoison, want.size());
    const auto src_base = reinterpret_cast<uint64_t>(src_dev);
    const auto dst_base = reinterpret_cast<uint64_t>(dst_dev);
    absl::StatusOr<Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    const std::string shape = kernels::PlanShapeKey(plan->header(), src_base, dst_base);
    absl::StatusOr<kernels::DevicePlanBuffer> dp =
        kernels::DevicePlanBuffer::Upload(plan->header(), plan->src_blocks().data(),
                                          plan->dst_blocks().data(), src_base, dst_base, nullptr);
    REQUIRE(dp.ok());
    for (int k = 0; k < 4; ++k) {
      INFO("plan " << k);
      if (k > 0) {
        for (auto& id : *c.spec.mutable_src()->mutable_block_ids()) {
          id = static_cast<uint32_t>(rng() % c.src.layout.num_blocks);
        }
        auto* dst_ids = c.spec.mutable_dst()->mutable_block_ids();
        std::shuffle(dst_ids->begin(), dst_ids->end(), rng);
        plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
        REQUIRE(plan.ok());
        REQUIRE(kernels::PlanShapeKey(plan->header(), src_base, dst_base) == shape);
        const bool staged = k % 2 == 1;
        REQUIRE(dp->UploadBlockIds(plan->src_blocks().data(), plan->dst_blocks().data(),
                                   staged ? staging : nullptr, staged ? staging_bytes : 0)
                    .ok());
      }
      for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
        planner::ExecuteTileHost(*plan, t, src.data(), want.data());
      }
      REQUIRE(kernels::LaunchKvCopy(dp->plan(), 0, plan->num_tiles(), 16, nullptr).ok());
      gpu_test::Sync();  // the staging and the tables are reused by the next rewrite
    }
    std::vector<uint8_t> got(want.size());
    gpu_test::CopyToHost(got.data(), dst_dev, got.size());
    if (got != want) {
      size_t first = 0;
      while (want[first] == got[first]) ++first;
      FAIL("first mismatch at dst byte " << first << ": kernel " << int(got[first])
                                         << ", host twin " << int(want[first]));
    }
    gpu_test::DeviceFree(src_dev);
    gpu_test::DeviceFree(dst_dev);
  }
  gpu_test::HostFree(staging);
}

TEST_CASE("launch errors are statuses") {
  if (!HaveGpu()) return;
  kernels::DevicePlan empty;
  CHECK(kernels::LaunchKvCopy(empty, 0, 1, 8, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  empty.num_tiles = 4;
  CHECK(kernels::LaunchKvCopy(empty, 0, 4, 8, nullptr, 1000).code() ==
        absl::StatusCode::kInvalidArgument);
}

// Bandwidth: 1 GiB of randomly scattered blocks (4 KiB and 32 KiB), same GPU, plain NHD, at a few
// CTA counts, beside a contiguous cudaMemcpy of the same bytes (the ceiling).
TEST_CASE("bandwidth print", "[bandwidth]") {
  if (!HaveGpu()) return;
  std::printf("device: %s, %d SMs\n", gpu_test::DeviceName(0).c_str(), gpu_test::SmCount(0));
  const uint64_t total = uint64_t{1} << 30;
  std::mt19937_64 rng(5);
  for (uint32_t heads : {1u, 8u}) {  // 16 tokens x heads x 128 x bf16: 4 KiB or 32 KiB blocks
    const uint64_t block = 16ull * heads * 128 * 2;
    const uint32_t n = static_cast<uint32_t>(total / block);
    kvrail::v1::PagedKvLayout lay;
    lay.set_num_layers(1);
    lay.set_num_parts(1);
    lay.set_num_blocks(2 * n);
    lay.set_tokens_per_block(16);
    lay.set_num_heads(heads);
    lay.set_head_dim(128);
    lay.set_dtype(kvrail::v1::DTYPE_BF16);
    lay.set_order(kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
    const uint64_t region = 2 * total;
    absl::StatusOr<planner::KvLayout> k = planner::ResolveLayout(lay, region, "");
    REQUIRE(k.ok());
    const planner::RegionView src{region, false, true, *k}, dst{region, true, true, *k};
    std::vector<uint32_t> ids(2 * n);
    std::iota(ids.begin(), ids.end(), 0);
    kvrail::v1::TransferSpec spec;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (uint32_t j = 0; j < n; ++j) spec.mutable_src()->add_block_ids(ids[j]);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (uint32_t j = 0; j < n; ++j) spec.mutable_dst()->add_block_ids(ids[j]);
    absl::StatusOr<Plan> plan = planner::MakePlan(spec, src, dst, {});
    REQUIRE(plan.ok());
    std::printf("%llu KiB blocks: %s\n", static_cast<unsigned long long>(block / 1024),
                plan->Describe().c_str());

    void* a = gpu_test::DeviceAlloc(region);
    void* b = gpu_test::DeviceAlloc(region);
    gpu_test::Memset(a, 1, region);
    absl::StatusOr<kernels::DevicePlanBuffer> dp = kernels::DevicePlanBuffer::Upload(
        plan->header(), plan->src_blocks().data(), plan->dst_blocks().data(),
        reinterpret_cast<uint64_t>(a), reinterpret_cast<uint64_t>(b), nullptr);
    REQUIRE(dp.ok());
    for (int ctas : {8, 16, 132}) {
      REQUIRE(kernels::LaunchKvCopy(dp->plan(), 0, plan->num_tiles(), ctas, nullptr).ok());  // warm
      gpu_test::Timer timer;
      const int iters = 5;
      timer.Start();
      for (int i = 0; i < iters; ++i) {
        REQUIRE(kernels::LaunchKvCopy(dp->plan(), 0, plan->num_tiles(), ctas, nullptr).ok());
      }
      const float ms = timer.StopMs() / iters;
      gpu_test::Sync();
      std::printf("  fused kernel, %3d CTAs x 512 threads: %7.1f GB/s (%.3f ms per GiB)\n", ctas,
                  total / (ms * 1e6), ms);
    }
    const float ce = gpu_test::TimeMemcpyD2D(b, a, total, 5);
    std::printf("  cudaMemcpy D2D, contiguous 1 GiB:     %7.1f GB/s (%.3f ms)\n",
                total / (ce * 1e6), ce);
    gpu_test::DeviceFree(a);
    gpu_test::DeviceFree(b);
  }
}

}  // namespace kvrail
