// GPU test of the integrity digest (kernels/kv_digest.h, the hash is kernels/digest.h):
// on random layouts, block tables, odd vector sizes and misaligned bases (every kernel path:
// warp pieces, 8/16-byte slabs, narrow-access words), the fused copy-and-hash kernel's per-tile
// digests equal the host reference (planner::TileDigestHost), its bytes equal the host twin's,
// and the read-back kernel over the destination (and the hash-only kernel over the source) give
// the same digests; a destination byte changed on the device changes exactly its tile's digest.
// Then the cost ("[bandwidth]"): 1 GiB of scattered blocks on one GPU, the plain kernel
// (LaunchKvCopy, digest off) against the fused copy-and-hash kernel (digest on), interleaved in
// one run, and the destination read-back pass on its own.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/kv_copy.h"
#include "kernels/kv_digest.h"
#include "kernels/kv_digest_forms.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/gpu/gpu_util.h"

namespace kvrail {
namespace {

using kernels::DigestKernelMode;
using planner::Plan;

int g_paths[3] = {0, 0, 0};  // cases on the warp path, the slab path, the word path

bool HaveGpu() { return gpu_test::HaveGpus(1, gpu_test::DeviceCount()); }

std::vector<uint64_t> RunDigest(const kernels::DevicePlan& plan, DigestKernelMode mode,
                                uint64_t* digests, std::mt19937_64& rng) {
  REQUIRE(kernels::ZeroDigests(digests, plan.num_tiles, nullptr).ok());
  uint32_t t = 0;
  while (t < plan.num_tiles) {
    const uint32_t n = 1 + static_cast<uint32_t>(rng() % std::max<uint32_t>(1, plan.num_tiles / 2));
    const uint32_t end = std::min(plan.num_tiles, t + n);
    const int ctas = 1 + static_cast<int>(rng() % 40);
    const int threads = 32 * (1 + static_cast<int>(rng() % 16));
    REQUIRE(kernels::LaunchKvDigestForm(plan, t, end, mode, digests, ctas, nullptr, threads).ok());
    t = end;
  }
  absl::StatusOr<std::vector<uint64_t>> got =
      kernels::ReadDigests(digests, 0, plan.num_tiles, nullptr);
  REQUIRE(got.ok());
  return *got;
}

void RunCase(const planner::testing::RandomCase& c, std::mt19937_64& rng, uint32_t misalign) {
  INFO(c.ToString());
  absl::StatusOr<Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  INFO(plan->Describe() << " misalign " << misalign);
  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> want(c.dst.size_bytes, 0xAB);
  std::vector<uint64_t> ref(plan->num_tiles());
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    ref[t] = planner::ExecuteTileHostWithDigest(*plan, t, src.data(), want.data());
  }
  uint8_t* src_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(src.size() + 16));
  gpu_test::CopyToDevice(src_dev + misalign, src.data(), src.size());
  const size_t dst_alloc = want.size() + 16;
  uint8_t* dst_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(dst_alloc));
  gpu_test::Memset(dst_dev, 0xAB, dst_alloc);
  uint64_t* digests = static_cast<uint64_t*>(gpu_test::DeviceAlloc(8 * (plan->num_tiles() + 1)));
  absl::StatusOr<kernels::DevicePlanBuffer> dp = kernels::DevicePlanBuffer::Upload(
      plan->header(), plan->src_blocks().data(), plan->dst_blocks().data(),
      reinterpret_cast<uint64_t>(src_dev + misalign),
      reinterpret_cast<uint64_t>(dst_dev + misalign), nullptr);
  REQUIRE(dp.ok());
  ++g_paths[dp->plan().piece_bytes != 0 ? 0 : dp->plan().access_bytes >= 8 ? 1 : 2];

  const std::vector<uint64_t> copied =
      RunDigest(dp->plan(), DigestKernelMode::kCopyHashSource, digests, rng);
  std::vector<uint8_t> got(dst_alloc);
  gpu_test::CopyToHost(got.data(), dst_dev, dst_alloc);
  REQUIRE(std::equal(want.begin(), want.end(), got.begin() + misalign));
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    INFO("tile " << t);
    REQUIRE(copied[t] == ref[t]);
  }
  REQUIRE(RunDigest(dp->plan(), DigestKernelMode::kHashDestination, digests, rng) == ref);
  REQUIRE(RunDigest(dp->plan(), DigestKernelMode::kHashSource, digests, rng) == ref);

  // One destination byte changed on the device: exactly its tile's read-back digest changes.
  const uint32_t bad = static_cast<uint32_t>(rng() % plan->num_tiles());
  std::vector<planner::CopyRun> runs;
  planner::ForEachTileRun(*plan, bad, [&](const planner::CopyRun& r) { runs.push_back(r); });
  const planner::CopyRun& r = runs[rng() % runs.size()];
  const uint64_t at = misalign + r.dst + rng() % r.bytes;
  uint8_t byte = static_cast<uint8_t>(got[at] ^ 0x01);
  gpu_test::CopyToDevice(dst_dev + at, &byte, 1);
  const std::vector<uint64_t> after =
      RunDigest(dp->plan(), DigestKernelMode::kHashDestination, digests, rng);
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    if (t == bad) {
      REQUIRE(after[t] != ref[t]);
    } else {
      REQUIRE(after[t] == ref[t]);
    }
  }
  // The benchmark's copy without the hash (warp and slab paths): copies the same bytes (the
  // changed byte written back) and leaves the digests alone.
  if (dp->plan().piece_bytes != 0 || dp->plan().access_bytes >= 8) {
    const int ctas = 1 + static_cast<int>(rng() % 40);
    REQUIRE(kernels::LaunchKvDigestForm(dp->plan(), 0, plan->num_tiles(),
                                        DigestKernelMode::kCopyNoHashForBenchmark, digests, ctas,
                                        nullptr)
                .ok());
    gpu_test::CopyToHost(got.data(), dst_dev, dst_alloc);
    REQUIRE(std::equal(want.begin(), want.end(), got.begin() + misalign));
    absl::StatusOr<std::vector<uint64_t>> kept =
        kernels::ReadDigests(digests, 0, plan->num_tiles(), nullptr);
    REQUIRE(kept.ok());
    REQUIRE(*kept == after);
  }
  // The previous (register) warp-path kernel, which the bench compares with: same digests.
  // So does the bulk-copy variant (its copy is checked after the one without the hash).
  if (dp->plan().piece_bytes != 0) {
    REQUIRE(RunDigest(dp->plan(), DigestKernelMode::kCopyHashSourceRegistersForBenchmark, digests,
                      rng) == ref);
    for (DigestKernelMode mode : {DigestKernelMode::kCopyHashSourceCpAsyncForBenchmark,
                                  DigestKernelMode::kCopyHashSourceBulkLoadForBenchmark,
                                  DigestKernelMode::kCopyNoHashBulkLoadForBenchmark}) {
      INFO("mode " << static_cast<int>(mode));
      gpu_test::Memset(dst_dev, 0xAB, dst_alloc);
      const bool hashes = mode != DigestKernelMode::kCopyNoHashBulkLoadForBenchmark;
      REQUIRE(RunDigest(dp->plan(), mode, digests, rng) ==
              (hashes ? ref : std::vector<uint64_t>(plan->num_tiles(), 0)));
      gpu_test::CopyToHost(got.data(), dst_dev, dst_alloc);
      for (uint32_t k = 0; k < misalign; ++k) REQUIRE(got[k] == 0xAB);
      REQUIRE(std::equal(want.begin(), want.end(), got.begin() + misalign));
    }
  }
  gpu_test::DeviceFree(digests);
  gpu_test::DeviceFree(src_dev);
  gpu_test::DeviceFree(dst_dev);
}

}  // namespace

TEST_CASE("GPU digest == host reference: random paged, serving and bytes transfers") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(1917);
  for (int n = 0; n < 150; ++n) {
    RunCase(planner::testing::RandomPagedCase(rng), rng, n % 4 == 0 ? rng() % 16 : 0);
  }
  for (int n = 0; n < 60; ++n) {
    RunCase(planner::testing::RandomServingCase(rng), rng, n % 5 == 0 ? rng() % 16 : 0);
  }
  for (int n = 0; n < 40; ++n) {
    RunCase(planner::testing::RandomBytesCase(rng, 1 << 20), rng, n % 3 == 0 ? rng() % 16 : 0);
  }
  std::printf("digest cases: %d warp path, %d slab path, %d word path\n", g_paths[0], g_paths[1],
              g_paths[2]);
  CHECK(g_paths[0] > 0);
  CHECK(g_paths[1] > 0);
  CHECK(g_paths[2] > 0);
}

// The staged warp kernel moves pieces with bulk copies (the SM's tensor memory accelerator):
// also into and out of mapped pinned host memory (a GPU -> host transfer on the kernel path), and
// in the variant with register stores.
TEST_CASE("GPU digest into mapped pinned host memory (bulk copies)") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(4242);
  int warp_cases = 0;
  for (int n = 0; n < 30; ++n) {
    const planner::testing::RandomCase c = planner::testing::RandomServingCase(rng);
    INFO(c.ToString());
    absl::StatusOr<Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    REQUIRE(plan.ok());
    std::vector<uint8_t> src(c.src.size_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> want(c.dst.size_bytes, 0xAB);
    std::vector<uint64_t> ref(plan->num_tiles());
    for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
      ref[t] = planner::ExecuteTileHostWithDigest(*plan, t, src.data(), want.data());
    }
    // Source in device memory (even cases) or in mapped host memory (odd), destination mapped.
    const bool src_on_host = n % 2 == 1;
    void* src_mapped = nullptr;
    uint8_t* src_host = nullptr;
    uint8_t* src_dev = nullptr;
    if (src_on_host) {
      src_host = static_cast<uint8_t*>(gpu_test::HostAllocMapped(src.size(), &src_mapped));
      std::copy(src.begin(), src.end(), src_host);
      src_dev = static_cast<uint8_t*>(src_mapped);
    } else {
      src_dev = static_cast<uint8_t*>(gpu_test::DeviceAlloc(src.size()));
      gpu_test::CopyToDevice(src_dev, src.data(), src.size());
    }
    void* dst_mapped = nullptr;
    uint8_t* dst_host = static_cast<uint8_t*>(gpu_test::HostAllocMapped(want.size(), &dst_mapped));
    uint64_t* digests = static_cast<uint64_t*>(gpu_test::DeviceAlloc(8 * (plan->num_tiles() + 1)));
    absl::StatusOr<kernels::DevicePlanBuffer> dp = kernels::DevicePlanBuffer::Upload(
        plan->header(), plan->src_blocks().data(), plan->dst_blocks().data(),
        reinterpret_cast<uint64_t>(src_dev), reinterpret_cast<uint64_t>(dst_mapped), nullptr);
    REQUIRE(dp.ok());
    if (dp->plan().piece_bytes != 0) ++warp_cases;
    std::vector<DigestKernelMode> modes = {DigestKernelMode::kCopyHashSource};
    if (dp->plan().piece_bytes != 0)
      modes.push_back(DigestKernelMode::kCopyHashSourceBulkLoadForBenchmark);
    for (DigestKernelMode mode : modes) {
      INFO("mode " << static_cast<int>(mode) << " src_on_host " << src_on_host);
      std::fill(dst_host, dst_host + want.size(), 0xAB);
      REQUIRE(RunDigest(dp->plan(), mode, digests, rng) == ref);
      REQUIRE(std::equal(want.begin(), want.end(), dst_host));
    }
    REQUIRE(RunDigest(dp->plan(), DigestKernelMode::kHashDestination, digests, rng) == ref);
    gpu_test::DeviceFree(digests);
    gpu_test::HostFree(dst_host);
    if (src_on_host) {
      gpu_test::HostFree(src_host);
    } else {
      gpu_test::DeviceFree(src_dev);
    }
  }
  CHECK(warp_cases >= 3);
}

// Cost: 1 GiB of scattered blocks (16 tokens x heads x 128 x bf16) from the source to the
// destination GPU of KVRAIL_GPU_PAIR (GPU0 -> GPU0 unless set; the kernels run on the source),
// NHD -> NHD (warp path) and NHD -> HND (slab path, 256-byte runs), at several CTA counts. Each
// round times the plain kernel then the fused one (5 launches each), 5 rounds; medians printed.
TEST_CASE("digest cost print", "[bandwidth]") {
  const std::pair<int, int> gpus = gpu_test::GpuPairFromEnv();
  const int src_gpu = gpus.first, dst_gpu = gpus.second;
  if (!gpu_test::HaveGpus(std::max(src_gpu, dst_gpu) + 1, gpu_test::DeviceCount())) return;
  gpu_test::UseGpuPair(src_gpu, dst_gpu);
  std::printf("device: %s, %d SMs; GPU%d -> GPU%d\n", gpu_test::DeviceName(src_gpu).c_str(),
              gpu_test::SmCount(src_gpu), src_gpu, dst_gpu);
  const uint64_t total = uint64_t{1} << 30;
  std::mt19937_64 rng(5);
  struct Shape {
    uint32_t heads;
    kvrail::v1::LayoutOrder dst_order;
  };
  for (const Shape shape : {Shape{8, kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD},
                            Shape{1, kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD},
                            Shape{8, kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND}}) {
    const uint64_t block = 16ull * shape.heads * 128 * 2;
    const uint32_t n = static_cast<uint32_t>(total / block);
    kvrail::v1::PagedKvLayout lay;
    lay.set_num_layers(1);
    lay.set_num_parts(1);
    lay.set_num_blocks(2 * n);
    lay.set_tokens_per_block(16);
    lay.set_num_heads(shape.heads);
    lay.set_head_dim(128);
    lay.set_dtype(kvrail::v1::DTYPE_BF16);
    lay.set_order(kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
    kvrail::v1::PagedKvLayout dlay = lay;
    dlay.set_order(shape.dst_order);
    const uint64_t region = 2 * total;
    const planner::RegionView src{region, false, true, *planner::ResolveLayout(lay, region, "")};
    const planner::RegionView dst{region, true, true, *planner::ResolveLayout(dlay, region, "")};
    std::vector<uint32_t> ids(2 * n);
    std::iota(ids.begin(), ids.end(), 0);
    kvrail::v1::TransferSpec spec;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (uint32_t j = 0; j < n; ++j) spec.mutable_src()->add_block_ids(ids[j]);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (uint32_t j = 0; j < n; ++j) spec.mutable_dst()->add_block_ids(ids[j]);
    absl::StatusOr<Plan> plan = planner::MakePlan(spec, src, dst, {});
    REQUIRE(plan.ok());
    void* a = gpu_test::DeviceAllocOn(src_gpu, region);
    void* b = gpu_test::DeviceAllocOn(dst_gpu, region);
    gpu_test::Memset(a, 1, region);
    uint64_t* digests = static_cast<uint64_t*>(gpu_test::DeviceAlloc(8 * plan->num_tiles()));
    absl::StatusOr<kernels::DevicePlanBuffer> dp = kernels::DevicePlanBuffer::Upload(
        plan->header(), plan->src_blocks().data(), plan->dst_blocks().data(),
        reinterpret_cast<uint64_t>(a), reinterpret_cast<uint64_t>(b), nullptr);
    REQUIRE(dp.ok());
    const kernels::DevicePlan& p = dp->plan();
    std::printf("%llu KiB blocks -> %s: %s; %s path\n",
                static_cast<unsigned long long>(block / 1024),
                shape.dst_order == kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND ? "HND" : "NHD",
                plan->Describe().c_str(), p.piece_bytes != 0 ? "warp" : "slab");
    // 0 plain, 1 copy+hash, 2 read-back, 3 the fused kernel's copy without the hash (the same
    // work distribution as 1: contiguous runs per warp, where the plain kernel strides), 4 the
    // previous copy+hash warp kernel (registers, no shared-memory staging), 5 the staged kernel
    // with per-lane cp.async, 6 / 7 with the bulk load but register stores (with / without hash)
    auto time = [&](int ctas, int what) {
      gpu_test::Timer timer;
      const int iters = 5;
      timer.Start();
      for (int i = 0; i < iters; ++i) {
        if (what == 0) {
          REQUIRE(kernels::LaunchKvCopy(p, 0, p.num_tiles, ctas, nullptr).ok());
        } else {
          REQUIRE(kernels::ZeroDigests(digests, p.num_tiles, nullptr).ok());
          REQUIRE(kernels::LaunchKvDigestForm(
                      p, 0, p.num_tiles,
                      what == 1   ? DigestKernelMode::kCopyHashSource
                      : what == 2 ? DigestKernelMode::kHashDestination
                      : what == 3 ? DigestKernelMode::kCopyNoHashForBenchmark
                      : what == 4 ? DigestKernelMode::kCopyHashSourceRegistersForBenchmark
                      : what == 5 ? DigestKernelMode::kCopyHashSourceCpAsyncForBenchmark
                      : what == 6 ? DigestKernelMode::kCopyHashSourceBulkLoadForBenchmark
                                  : DigestKernelMode::kCopyNoHashBulkLoadForBenchmark,
                      digests, ctas, nullptr)
                      .ok());
        }
      }
      const float ms = timer.StopMs() / iters;
      gpu_test::Sync();
      return total / (ms * 1e6);  // GB/s
    };
    for (int ctas : {8, 16, 32, 132}) {
      time(ctas, 0);
      time(ctas, 1);  // warm-up
      std::vector<double> off, on, back, same, regs, lanes, bulk, bulk_same;
      for (int round = 0; round < 5; ++round) {
        off.push_back(time(ctas, 0));
        on.push_back(time(ctas, 1));
        back.push_back(time(ctas, 2));
        same.push_back(time(ctas, 3));
        if (p.piece_bytes != 0) {
          regs.push_back(time(ctas, 4));
          lanes.push_back(time(ctas, 5));
          bulk.push_back(time(ctas, 6));
          bulk_same.push_back(time(ctas, 7));
        }
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double m_off = median(off), m_on = median(on), m_back = median(back),
                   m_same = median(same), m_regs = regs.empty() ? 0.0 : median(regs);
      // End to end with the read-back: the two passes one after the other.
      const double both = 1.0 / (1.0 / m_on + 1.0 / m_back);
      std::printf(
          "  %3d CTAs: digest off %7.1f GB/s | on (fused copy+hash) %7.1f GB/s (%+.1f%%) | "
          "read-back alone %7.1f GB/s | on + read-back %7.1f GB/s (%+.1f%%) | fused copy "
          "without hash %7.1f GB/s (on vs it %+.1f%%) | previous register kernel %7.1f GB/s "
          "(%+.1f%%)\n",
          ctas, m_off, m_on, 100.0 * (m_on - m_off) / m_off, m_back, both,
          100.0 * (both - m_off) / m_off, m_same, 100.0 * (m_on - m_same) / m_same, m_regs,
          m_off > 0 && m_regs > 0 ? 100.0 * (m_regs - m_off) / m_off : 0.0);
      char bulk_text[160] = "";
      if (!bulk.empty()) {
        std::snprintf(
            bulk_text, sizeof(bulk_text),
            " | lane cp.async %.1f (%+.1f%%) | bulk load only %.1f (%+.1f%%), no-hash %.1f",
            median(lanes), 100.0 * (median(lanes) - m_off) / m_off, median(bulk),
            100.0 * (median(bulk) - m_off) / m_off, median(bulk_same));
      }
      std::printf(
          "  SUMMARY %3d CTAs: off %.1f | on %.1f (%+.1f%%) | same-distr %.1f | read-back "
          "%.1f | registers %.1f%s\n",
          ctas, m_off, m_on, 100.0 * (m_on - m_off) / m_off, m_same, m_back, m_regs, bulk_text);
    }
    gpu_test::DeviceFree(digests);
    gpu_test::DeviceFree(a);
    gpu_test::DeviceFree(b);
  }
}

}  // namespace kvrail
