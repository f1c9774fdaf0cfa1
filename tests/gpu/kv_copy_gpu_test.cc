// GPU test of the fused kernel (runs on the lent GPU machine, not in CI): random layouts, block
// tables and conversions, the kernel's result compared byte for byte with the host twin (which
// the unit tests compare with a naive reference), destinations poisoned so stray writes show;
// device -> mapped pinned host too. Ends with a small bandwidth print.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/kv_copy.h"
#include "tests/gpu/gpu_util.h"

namespace kvrail {
namespace {

// Cases whose plan took the kernel's warp path (DevicePlan::piece_bytes set).
int g_warp_path_cases = 0;

using planner::Plan;
constexpr uint8_t kPoison = 0xAB;

bool HaveGpu() {
  if (gpu_test::DeviceCount() > 0) return true;
  WARN("no CUDA device: skipped");
  return false;
}

// Runs `c` on the GPU (dst in device memory or mapped pinned host memory, bases shifted by
// `misalign` bytes to exercise narrow accesses) and compares with the host twin.
void RunCase(const planner::testing::RandomCase& c, std::mt19937_64& rng, bool dst_on_host,
             uint32_t misalign) {
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
      reinterpret_cast<uint64_t>(src_dev + misalign), reinterpret_cast<uint64_t>(dst_dev + misalign),
      nullptr);
  REQUIRE(dp.ok());
  if (dp->plan().piece_bytes != 0) ++g_warp_path_cases;
  // Tiles in a few random ranges, each with a random CTA count.
  uint32_t t = 0;
  while (t < plan->num_tiles()) {
    const uint32_t n = 1 + static_cast<uint32_t>(rng() % std::max<uint32_t>(1, plan->num_tiles() / 2));
    const uint32_t end = std::min(plan->num_tiles(), t + n);
    const int ctas = 1 + static_cast<int>(rng() % 40);
    const int threads = 32 * (1 + static_cast<int>(rng() % 16));
    REQUIRE(kernels::LaunchKvCopy(dp->plan(), t, end, ctas, nullptr, threads).ok());
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
            rng, /*dst_on_host=*/false, n % 5 == 0 ? static_cast<uint32_t>(rng() % 16) : 0);
  }
}

TEST_CASE("kernel == host twin on serving layouts (mostly the warp path)") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(2911);
  const int before = g_warp_path_cases;
  for (int n = 0; n < 120; ++n) {
    RunCase(planner::testing::RandomServingCase(rng), rng, /*dst_on_host=*/n % 6 == 5,
            n % 4 == 0 ? static_cast<uint32_t>(rng() % 16) : 0);
  }
  CHECK(g_warp_path_cases - before >= 20);  // misaligned bases take the slab path
}

TEST_CASE("kernel == host twin on random bytes transfers") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(31);
  for (int n = 0; n < 60; ++n) {
    RunCase(planner::testing::RandomBytesCase(rng, 1 << 22), rng, n % 4 == 0,
            n % 3 == 0 ? static_cast<uint32_t>(rng() % 16) : 0);
  }
}

TEST_CASE("kernel == host twin into mapped pinned host memory") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(77);
  for (int n = 0; n < 60; ++n) {
    RunCase(planner::testing::RandomPagedCase(rng), rng, /*dst_on_host=*/true, 0);
  }
}

TEST_CASE("launch errors are statuses") {
  if (!HaveGpu()) return;
  kernels::DevicePlan empty;
  CHECK(kernels::LaunchKvCopy(empty, 0, 1, 8, nullptr).code() == absl::StatusCode::kInvalidArgument);
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
    std::printf("  cudaMemcpy D2D, contiguous 1 GiB:     %7.1f GB/s (%.3f ms)\n", total / (ce * 1e6), ce);
    gpu_test::DeviceFree(a);
    gpu_test::DeviceFree(b);
  }
}

}  // namespace kvrail
