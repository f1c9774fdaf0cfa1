// The kernels' pre-sm_90 forms on the GPU at hand. This binary links the copy and digest libraries
// built as compute_80 PTX only (//kernels:kv_copy_ptx80, bazel/cuda.bzl: GENCODE_PTX80): the
// driver JIT-compiles them as sm_80 code, on an A100 or L40 as on an H100/H200, so the forms an
// A100 or L40 runs (the slab and warp paths' 16-byte vectors, the split segment form with
// cp.async, the digest staged by per-lane cp.async) run here, and the bulk-copy (TMA) forms,
// which are not in that code, must never be launched (kernels/kernel_arch.h). The bytes and
// per-tile digests are compared with the host twin and the host digest reference, which
// kv_copy_gpu_test and digest_gpu_test compare the sm_90 forms with on the same cases'
// generators: both paths equal the same reference.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/kernel_arch.h"
#include "kernels/kv_copy.h"
#include "kernels/kv_digest.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/gpu/gpu_util.h"

namespace kvrail {
namespace {

using kernels::DigestKernelMode;
using kernels::SegmentForm;
using planner::Plan;
constexpr uint8_t kPoison = 0xAB;

// Cases by path: warp pieces, slabs, segments.
int g_paths[3] = {0, 0, 0};

bool HaveGpu() { return gpu_test::HaveGpus(1, gpu_test::DeviceCount()); }

struct Buffers {
  uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  size_t dst_alloc = 0;
  ~Buffers() {
    if (src != nullptr) gpu_test::DeviceFree(src);
    if (dst != nullptr) gpu_test::DeviceFree(dst);
  }
};

// Random tile ranges, CTA counts and CTA sizes over the whole plan.
template <typename Launch>
void LaunchInRanges(uint32_t num_tiles, std::mt19937_64& rng, Launch launch) {
  uint32_t t = 0;
  while (t < num_tiles) {
    const uint32_t n = 1 + static_cast<uint32_t>(rng() % std::max<uint32_t>(1, num_tiles / 2));
    const uint32_t end = std::min(num_tiles, t + n);
    const int ctas = 1 + static_cast<int>(rng() % 40);
    const int threads = 32 * (1 + static_cast<int>(rng() % 16));
    launch(t, end, ctas, threads);
    t = end;
  }
}

// Copies `c` with LaunchKvCopy (the path and segment form Upload picks for this GPU; with
// `force_segments` a chunked plan takes the segment path, and with `ask_bulk` it asks for the
// bulk-staged form, which the launch must turn into the split form here), then with the fused
// copy + hash and the hash-only digests; every result against the host's.
void RunCase(const planner::testing::RandomCase& c, std::mt19937_64& rng, uint32_t misalign,
             bool force_segments, bool ask_bulk) {
  INFO(c.ToString());
  absl::StatusOr<Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  INFO(plan->Describe() << " misalign " << misalign << " force_segments " << force_segments
                        << " ask_bulk " << ask_bulk);
  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> want(c.dst.size_bytes, kPoison);
  std::vector<uint64_t> ref(plan->num_tiles());
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    ref[t] = planner::ExecuteTileHostWithDigest(*plan, t, src.data(), want.data());
  }
  Buffers b;
  b.src = static_cast<uint8_t*>(gpu_test::DeviceAlloc(src.size() + 16));
  gpu_test::CopyToDevice(b.src + misalign, src.data(), src.size());
  b.dst_alloc = want.size() + 16;
  b.dst = static_cast<uint8_t*>(gpu_test::DeviceAlloc(b.dst_alloc));
  absl::StatusOr<kernels::DevicePlanBuffer> dp = kernels::DevicePlanBuffer::Upload(
      plan->header(), plan->src_blocks().data(), plan->dst_blocks().data(),
      reinterpret_cast<uint64_t>(b.src + misalign), reinterpret_cast<uint64_t>(b.dst + misalign),
      nullptr);
  REQUIRE(dp.ok());
  // Upload never picks a bulk-staged form on this code.
  CHECK_FALSE(kernels::IsBulkSegmentForm(dp->plan().segment_form));

  auto check_bytes = [&]() {
    std::vector<uint8_t> got(b.dst_alloc);
    gpu_test::CopyToHost(got.data(), b.dst, b.dst_alloc);
    for (uint32_t k = 0; k < misalign; ++k) REQUIRE(got[k] == kPoison);
    for (size_t k = misalign + want.size(); k < b.dst_alloc; ++k) REQUIRE(got[k] == kPoison);
    if (!std::equal(want.begin(), want.end(), got.begin() + misalign)) {
      size_t first = 0;
      while (want[first] == got[misalign + first]) ++first;
      FAIL("first mismatch at dst byte " << first << ": kernel " << int(got[misalign + first])
                                         << ", host twin " << int(want[first]));
    }
  };

  kernels::DevicePlan launch_plan = dp->plan();
  if (force_segments && plan->header().chunk_kind != 0) {  // any chunked plan (not kBytes)
    launch_plan.piece_bytes = 0;
    launch_plan.segments = true;
  }
  if (ask_bulk) launch_plan.segment_form = SegmentForm::kBulk3;
  ++g_paths[launch_plan.piece_bytes != 0 ? 0 : launch_plan.segments ? 2 : 1];
  gpu_test::Memset(b.dst, kPoison, b.dst_alloc);
  LaunchInRanges(plan->num_tiles(), rng, [&](uint32_t t, uint32_t end, int ctas, int threads) {
    REQUIRE(kernels::LaunchKvCopy(launch_plan, t, end, ctas, nullptr, threads).ok());
  });
  gpu_test::Sync();
  check_bytes();

  // The digest kernels on the plan as uploaded.
  uint64_t* digests = static_cast<uint64_t*>(gpu_test::DeviceAlloc(8 * (plan->num_tiles() + 1)));
  auto run_digest = [&](DigestKernelMode mode) {
    REQUIRE(kernels::ZeroDigests(digests, plan->num_tiles(), nullptr).ok());
    LaunchInRanges(plan->num_tiles(), rng, [&](uint32_t t, uint32_t end, int ctas, int threads) {
      REQUIRE(
          kernels::LaunchKvDigest(dp->plan(), t, end, mode, digests, ctas, nullptr, threads).ok());
    });
    absl::StatusOr<std::vector<uint64_t>> got =
        kernels::ReadDigests(digests, 0, plan->num_tiles(), nullptr);
    REQUIRE(got.ok());
    return *got;
  };
  gpu_test::Memset(b.dst, kPoison, b.dst_alloc);
  CHECK(run_digest(DigestKernelMode::kCopyHashSource) == ref);
  check_bytes();
  CHECK(run_digest(DigestKernelMode::kHashDestination) == ref);
  CHECK(run_digest(DigestKernelMode::kHashSource) == ref);
  gpu_test::DeviceFree(digests);
}

}  // namespace

TEST_CASE("the kernels run as sm_80 code, without the bulk-copy forms") {
  if (!HaveGpu()) return;
  absl::StatusOr<kernels::KernelArch> arch = kernels::CurrentKernelArch();
  REQUIRE(arch.ok());
  std::printf("GPU 0: %s, compute capability %d.%d, runs the kernels as sm_%d\n",
              gpu_test::DeviceName(0).c_str(), arch->device_cc / 10, arch->device_cc % 10,
              arch->code_arch);
  CHECK(arch->code_arch == 80);
  CHECK(kernels::RunsKernels(*arch));
  CHECK_FALSE(kernels::HasBulkCopies(*arch));
  CHECK(kernels::DigestStagingOn(*arch) == kernels::DigestStaging::kLaneCopies);
  // The warm-up launches every kernel this code has and leaves out the bulk-copy form.
  CHECK(kernels::WarmUpKvCopy(nullptr).ok());
}

TEST_CASE("pre-sm_90 forms == host twin and host digests: paged, serving and bytes transfers") {
  if (!HaveGpu()) return;
  std::mt19937_64 rng(8080);
  planner::testing::RandomLimits big;
  big.max_blocks = 64;
  big.max_head_dim = 64;
  big.max_heads = 8;
  big.max_tpb = 32;
  for (int n = 0; n < 120; ++n) {
    RunCase(
        planner::testing::RandomPagedCase(rng, n % 3 == 0 ? big : planner::testing::RandomLimits{}),
        rng, n % 4 == 0 ? static_cast<uint32_t>(rng() % 16) : 0,
        /*force_segments=*/n % 3 == 1, /*ask_bulk=*/n % 2 == 0);
  }
  for (int n = 0; n < 60; ++n) {
    RunCase(planner::testing::RandomServingCase(rng), rng,
            n % 5 == 0 ? static_cast<uint32_t>(rng() % 16) : 0, /*force_segments=*/n % 4 == 1,
            /*ask_bulk=*/n % 2 == 1);
  }
  for (int n = 0; n < 20; ++n) {
    RunCase(planner::testing::RandomBytesCase(rng, 1 << 20), rng,
            n % 3 == 0 ? static_cast<uint32_t>(rng() % 16) : 0, false, false);
  }
  std::printf("cases: %d warp path, %d slab path, %d segment path\n", g_paths[0], g_paths[1],
              g_paths[2]);
  // Each path is exercised: the seeded mix sends 5 cases down the warp path on sm_80 code (the
  // pre-sm_90 choice sends more of them to segments than sm_90 code does), 41 to the slab path.
  CHECK(g_paths[0] >= 3);
  CHECK(g_paths[1] >= 10);
  CHECK(g_paths[2] >= 20);
}

}  // namespace kvrail
