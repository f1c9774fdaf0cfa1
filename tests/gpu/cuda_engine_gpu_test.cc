// End-to-end GPU test of the CUDA engine through the real kvraild (runs on the lent GPU machine,
// not in CI): random layouts, block tables and conversions moved between CUDA regions on one GPU
// and between a GPU and host memory, with the kernel, with copy engines only and with a fixed
// small CTA count; the destination is poisoned first and compared byte for byte (bytes outside
// the destination blocks included) with the host twin. Then a client process that dies while its
// GPU region is in use by a layer-wise transfer: the daemon keeps serving and releases the
// mapping once the transfer ends.
//
// Outside Bazel, point TEST_SRCDIR/TEST_WORKSPACE at a folder holding daemon/kvraild and
// examples/kv_demo (see docs/benchmarks.md, "CUDA engine, one H200").
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/harness/daemon_process.h"
#include "tests/integration/kv_fixture.h"

extern char** environ;

namespace kvrail {
namespace {

constexpr uint8_t kPoison = 0xAB;
using client::CudaBuffer;

bool HaveGpu() { return gpu_test::HaveGpus(1, client::CudaDeviceCount()); }

// kGpu is GPU0; kGpu1 is the second GPU (peer cases, only where two exist).
enum class Kind { kGpu, kGpu1, kHost };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kGpu:
      return "gpu0";
    case Kind::kGpu1:
      return "gpu1";
    case Kind::kHost:
      return "host";
  }
  return "?";
}

// One side of a case: GPU memory or a host buffer, registered with the daemon.
struct Side {
  std::unique_ptr<CudaBuffer> gpu;
  std::unique_ptr<client::HostBuffer> host;
  v1::RegionInfo info;
  void Write(const std::vector<uint8_t>& bytes) {
    if (gpu) {
      REQUIRE(gpu->CopyFromHost(0, bytes.data(), bytes.size()).ok());
    } else {
      std::memcpy(host->data(), bytes.data(), bytes.size());
    }
  }
  std::vector<uint8_t> Read(size_t n) const {
    std::vector<uint8_t> out(n);
    if (gpu) {
      REQUIRE(gpu->CopyToHost(0, out.data(), n).ok());
    } else {
      std::memcpy(out.data(), host->data(), n);
    }
    return out;
  }
};

Side MakeSide(client::Client& c, Kind kind, const v1::PagedKvLayout* layout, uint64_t bytes,
              bool writable, const std::vector<uint8_t>& content) {
  Side side;
  v1::RegionSpec spec;
  spec.set_name(KindName(kind));
  spec.set_writable(writable);
  if (layout != nullptr) {
    *spec.mutable_paged_kv() = *layout;
  } else {
    spec.mutable_bytes();
  }
  absl::StatusOr<v1::RegionInfo> info;
  if (kind != Kind::kHost) {
    auto buffer = CudaBuffer::Create(kind == Kind::kGpu1 ? 1 : 0, bytes);
    REQUIRE(buffer.ok());
    side.gpu = *std::move(buffer);
    side.Write(content);
    info = client::RegisterCudaRegion(c, side.gpu->data(), bytes, spec);
  } else {
    auto buffer = c.CreateHostBuffer(bytes);
    REQUIRE(buffer.ok());
    side.host = *std::move(buffer);
    side.Write(content);
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(bytes);
    info = c.RegisterHostBuffer(*side.host, spec);
  }
  INFO(info.status().ToString());
  REQUIRE(info.ok());
  side.info = *info;
  return side;
}

// want_engine for a copy-engine-only daemon with the default small-kernel setting.
const char kCopyOnlyAuto[] = "copy-only-auto";

// want_engine for a daemon that splits kernel batches with the copy engines.
const char kSplit[] = "split";

// A copy-engine-only daemon that never uses a kernel: --config with cuda_copy_only_kernel_ctas 0.
std::vector<std::string> CopyEnginesOnlyArgs(const testing::TempDir& dir) {
  const std::string path = dir.path() + "/copy_only.textproto";
  std::ofstream(path) << "cuda_max_ctas: 0\ncuda_copy_only_kernel_ctas: 0\n";
  return {"--config", path};
}

// Moves `c` through the daemon from `src_kind` to `dst_kind` and compares with the host twin.
void RunCase(client::Client& cl, const planner::testing::RandomCase& c, Kind src_kind,
             Kind dst_kind, std::mt19937_64& rng, const std::string& want_engine) {
  INFO(c.ToString());
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  std::vector<uint8_t> src(c.src.size_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> want(c.dst.size_bytes, kPoison);
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    planner::ExecuteTileHost(*plan, t, src.data(), want.data());
  }
  const bool paged = c.src.paged;
  Side s = MakeSide(cl, src_kind, paged ? &c.src_layout : nullptr, c.src.size_bytes, false, src);
  Side d = MakeSide(cl, dst_kind, paged ? &c.dst_layout : nullptr, c.dst.size_bytes, true,
                    std::vector<uint8_t>(c.dst.size_bytes, kPoison));
  v1::TransferSpec spec = c.spec;
  spec.mutable_src()->set_region_id(s.info.region_id());
  spec.mutable_dst()->set_region_id(d.info.region_id());
  auto submitted = cl.Submit(spec);
  INFO(submitted.status().ToString());
  REQUIRE(submitted.ok());
  auto status = cl.Wait(submitted->transfer_id(), absl::Seconds(30));
  REQUIRE(status.ok());
  INFO(status->DebugString());
  REQUIRE(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
  // Two GPUs of one node here are joined by NVLink (NV18 on the lent machine).
  const bool peer = src_kind != Kind::kHost && dst_kind != Kind::kHost && src_kind != dst_kind;
  CHECK(status->path() == (peer ? v1::PATH_NVLINK_P2P : v1::PATH_CUDA_LOCAL));
  if (want_engine == kCopyOnlyAuto && plan->bytes_total() > 0) {
    // cuda_max_ctas 0 with the default cuda_copy_only_kernel_*: plans whose runs average under
    // 128 KiB go to a small kernel, and path_reason says so.
    const bool tiny = plan->bytes_total() / std::max<uint64_t>(plan->num_runs(), 1) < (128 << 10);
    CHECK(status->engine() == (tiny ? "cuda-kernel" : "cuda-copy-engine"));
    if (tiny) CHECK(status->path_reason().find("cuda_copy_only_kernel_ctas") != std::string::npos);
  } else if (want_engine == kSplit && plan->bytes_total() > 0) {
    // Kernel batches of two or more tiles hand their last 30% to the copy engines.
    CHECK(
        (status->engine() == "cuda-kernel" || status->engine() == "cuda-kernel+cuda-copy-engine"));
  } else if (!want_engine.empty() && plan->bytes_total() > 0) {
    CHECK(status->engine() == want_engine);
  }
  const std::vector<uint8_t> got = d.Read(c.dst.size_bytes);
  size_t first = 0;
  while (first < got.size() && got[first] == want[first]) ++first;
  INFO("first differing byte " << first << " of " << got.size());
  CHECK(got == want);
  REQUIRE(cl.UnregisterRegion(s.info.region_id()).ok());
  REQUIRE(cl.UnregisterRegion(d.info.region_id()).ok());
}

void RunRandomCases(const std::vector<std::string>& daemon_args, const std::string& want_engine,
                    int cases, bool peer = false) {
  testing::LiveDaemon live(daemon_args);
  client::Client& cl = *live.client;
  std::mt19937_64 rng(1234);
  const Kind local[3][2] = {
      {Kind::kGpu, Kind::kGpu}, {Kind::kGpu, Kind::kHost}, {Kind::kHost, Kind::kGpu}};
  const Kind peers[3][2] = {
      {Kind::kGpu, Kind::kGpu1}, {Kind::kGpu1, Kind::kGpu}, {Kind::kGpu1, Kind::kHost}};
  for (int i = 0; i < cases; ++i) {
    const auto c = (i % 5 == 4)   ? planner::testing::RandomBytesCase(rng)
                   : (i % 5 == 3) ? planner::testing::RandomServingCase(rng)
                                  : planner::testing::RandomPagedCase(rng);
    const Kind* k = peer ? peers[i % 3] : local[i % 3];
    INFO("case " << i << " src " << KindName(k[0]) << " dst " << KindName(k[1]));
    RunCase(cl, c, k[0], k[1], rng, want_engine);
  }
  auto stats = cl.GetStats();
  REQUIRE(stats.ok());
  for (const auto& e : stats->engines()) WARN("engine: " << e);
  if (want_engine == kSplit) {
    bool split = false;
    for (const auto& e : stats->engines()) {
      split = split || e.find("kernel batches split with the copy engines") != std::string::npos;
    }
    CHECK(split);  // some batches really ran on both
  }
}

TEST_CASE("CUDA engine, kernel: random layouts GPU->GPU, GPU->host, host->GPU vs host twin") {
  if (!HaveGpu()) return;
  RunRandomCases({}, "cuda-kernel", 90);
}

TEST_CASE("CUDA engine, copy engines only (SM budget 0, no kernel allowed) vs host twin") {
  if (!HaveGpu()) return;
  testing::TempDir dir;
  RunRandomCases(CopyEnginesOnlyArgs(dir), "cuda-copy-engine", 45);
}

TEST_CASE("CUDA engine, SM budget 0: tiny-run plans on a small kernel, said in path_reason") {
  if (!HaveGpu()) return;
  RunRandomCases({"--cuda-max-ctas", "0"}, kCopyOnlyAuto, 45);
}

TEST_CASE("CUDA engine, 4 fixed CTAs and small tiles vs host twin") {
  if (!HaveGpu()) return;
  RunRandomCases({"--cuda-fixed-ctas", "4", "--tile-bytes", "4096"}, "cuda-kernel", 45);
}

TEST_CASE("CUDA engine, kernel + copy engines (30% of each batch, small tiles) vs host twin") {
  if (!HaveGpu()) return;
  testing::TempDir dir;
  const std::string path = dir.path() + "/split.textproto";
  std::ofstream(path) << "cuda_copy_split_fixed_percent: 30\ntile_bytes: 4096\n";
  RunRandomCases({"--config", path}, kSplit, 45);
}

bool HaveTwoGpus() { return gpu_test::HaveGpus(2, client::CudaDeviceCount()); }

TEST_CASE("two GPUs, kernel: random layouts GPU0->GPU1, GPU1->GPU0, GPU1->host vs host twin") {
  if (!HaveTwoGpus()) return;
  RunRandomCases({}, "cuda-kernel", 60, /*peer=*/true);
}

TEST_CASE(
    "two GPUs, kernel on the destination GPU (peer loads): GPU0->GPU1, GPU1->GPU0 vs host twin") {
  if (!HaveTwoGpus()) return;
  RunRandomCases({"--cuda-run-on", "destination"}, "cuda-kernel", 45, /*peer=*/true);
}

TEST_CASE("two GPUs, copy engines only vs host twin") {
  if (!HaveTwoGpus()) return;
  testing::TempDir dir;
  RunRandomCases(CopyEnginesOnlyArgs(dir), "cuda-copy-engine", 30, /*peer=*/true);
}

// The same transfer with other block ids (the source's drawn again, the destination's
// shuffled): the same plan shape.
planner::testing::RandomCase OtherIds(const planner::testing::RandomCase& c, std::mt19937_64& rng) {
  planner::testing::RandomCase o = c;
  for (auto& id : *o.spec.mutable_src()->mutable_block_ids()) {
    id = static_cast<uint32_t>(rng() % c.src.layout.num_blocks);
  }
  auto* dst = o.spec.mutable_dst()->mutable_block_ids();
  std::shuffle(dst->begin(), dst->end(), rng);
  return o;
}

// What the engines line says of plans kept warm: jobs that uploaded their block ids only.
uint64_t WarmPlanHits(client::Client& cl) {
  auto stats = cl.GetStats();
  REQUIRE(stats.ok());
  uint64_t hits = 0;
  for (const auto& e : stats->engines()) {
    WARN("engine: " << e);
    const size_t at = e.find("warm plans: ");
    if (at != std::string::npos) hits += std::stoull(e.substr(at + 12));
  }
  return hits;
}

// Plans kept warm: one pair of regions per case and transfers of one shape with other block ids
// each time, one after another; all but the first rewrite only the ids of the plan kept on the
// GPU, and each lands byte for byte where its own tables say (the poisoned destination compared
// whole, with the host twin run over every transfer so far in order).
void RunWarmCases(const std::vector<std::string>& daemon_args, bool warm) {
  testing::LiveDaemon live(daemon_args);
  client::Client& cl = *live.client;
  std::mt19937_64 rng(4321);
  const Kind local[3][2] = {
      {Kind::kGpu, Kind::kGpu}, {Kind::kGpu, Kind::kHost}, {Kind::kHost, Kind::kGpu}};
  uint64_t want_hits = 0;
  for (int i = 0; i < 18; ++i) {
    planner::testing::RandomCase c = i % 2 == 0 ? planner::testing::RandomPagedCase(rng)
                                                : planner::testing::RandomServingCase(rng);
    const Kind* k = local[i % 3];
    INFO("case " << i << " src " << KindName(k[0]) << " dst " << KindName(k[1]));
    std::vector<uint8_t> src(c.src.size_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> want(c.dst.size_bytes, kPoison);
    Side s = MakeSide(cl, k[0], &c.src_layout, c.src.size_bytes, false, src);
    Side d = MakeSide(cl, k[1], &c.dst_layout, c.dst.size_bytes, true, want);
    bool kept = false;
    for (int n = 0; n < 4; ++n) {
      INFO("transfer " << n << ": " << c.ToString());
      absl::StatusOr<planner::Plan> plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
      REQUIRE(plan.ok());
      for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
        planner::ExecuteTileHost(*plan, t, src.data(), want.data());
      }
      v1::TransferSpec spec = c.spec;
      spec.mutable_src()->set_region_id(s.info.region_id());
      spec.mutable_dst()->set_region_id(d.info.region_id());
      auto submitted = cl.Submit(spec);
      REQUIRE(submitted.ok());
      auto status = cl.Wait(submitted->transfer_id(), absl::Seconds(30));
      REQUIRE(status.ok());
      INFO(status->DebugString());
      REQUIRE(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
      // A kernel job's plan is uploaded (a copy-engine job has none, and the mode follows the
      // ids' runs): a kernel job finds a plan kept when one of the shape ran on the kernel before.
      if (status->engine().find("cuda-kernel") != std::string::npos) {
        if (warm && kept) ++want_hits;
        kept = true;
      }
      const std::vector<uint8_t> got = d.Read(c.dst.size_bytes);
      size_t first = 0;
      while (first < got.size() && got[first] == want[first]) ++first;
      INFO("first differing byte " << first << " of " << got.size());
      CHECK(got == want);
      c = OtherIds(c, rng);
    }
    REQUIRE(cl.UnregisterRegion(s.info.region_id()).ok());
    REQUIRE(cl.UnregisterRegion(d.info.region_id()).ok());
  }
  CHECK(WarmPlanHits(cl) == want_hits);
  if (warm) CHECK(want_hits > 0);
}

TEST_CASE("CUDA engine, warm plans: a repeated shape with other block ids vs host twin") {
  if (!HaveGpu()) return;
  RunWarmCases({}, /*warm=*/true);
}

TEST_CASE("CUDA engine, warm plans off: the same transfers upload whole plans vs host twin") {
  if (!HaveGpu()) return;
  testing::TempDir dir;
  const std::string path = dir.path() + "/cold.textproto";
  std::ofstream(path) << "cuda_warm_plans: false\n";
  RunWarmCases({"--config", path}, /*warm=*/false);
}

// Plans keep their block tables in the CUDA engine's pinned pool, which the engine uploads
// asynchronously and recycles for the next plans: many transfers with large, different tables
// in flight at once must each land exactly where their own table says.
TEST_CASE("CUDA engine: concurrent transfers with large block tables (pinned, recycled tables)") {
  if (!HaveGpu()) return;
  testing::LiveDaemon live;
  client::Client& cl = *live.client;
  constexpr uint32_t kTransfers = 12, kPerTransfer = 12000, kSrcBlocks = 16384;
  // 1 KiB blocks: 8 tokens x 1 head x 64 x bf16.
  const v1::PagedKvLayout src_layout = testing::MakeLayout(
      1, 1, kSrcBlocks, 8, 1, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const v1::PagedKvLayout dst_layout =
      testing::MakeLayout(1, 1, kTransfers * kPerTransfer, 8, 1, 64, v1::DTYPE_BF16,
                          v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const uint64_t src_bytes = testing::LayoutBytes(src_layout);
  const uint64_t dst_bytes = testing::LayoutBytes(dst_layout);
  std::mt19937_64 rng(77);
  std::vector<uint8_t> src(src_bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  Side s = MakeSide(cl, Kind::kGpu, &src_layout, src_bytes, false, src);
  Side d = MakeSide(cl, Kind::kGpu, &dst_layout, dst_bytes, true,
                    std::vector<uint8_t>(dst_bytes, kPoison));
  std::vector<std::vector<uint32_t>> from(kTransfers);
  std::vector<uint64_t> ids;
  for (uint32_t k = 0; k < kTransfers; ++k) {
    std::vector<uint32_t> perm(kSrcBlocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    from[k].assign(perm.begin(), perm.begin() + kPerTransfer);
    std::vector<uint32_t> to(kPerTransfer);
    std::iota(to.begin(), to.end(), k * kPerTransfer);
    std::shuffle(to.begin(), to.end(), rng);
    // Destination block to[j] gets source block from[k][j]; keep it as "dst block -> src block".
    std::vector<uint32_t> by_dst(kPerTransfer);
    for (uint32_t j = 0; j < kPerTransfer; ++j) by_dst[to[j] - k * kPerTransfer] = from[k][j];
    auto submitted =
        cl.Submit(client::MakeBlockTransfer(s.info.region_id(), from[k], d.info.region_id(), to));
    INFO(submitted.status().ToString());
    REQUIRE(submitted.ok());
    ids.push_back(submitted->transfer_id());
    from[k] = std::move(by_dst);
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    auto status = cl.Wait(ids[k], absl::Seconds(30));
    REQUIRE(status.ok());
    INFO(status->DebugString());
    CHECK(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
    CHECK(status->engine() == "cuda-kernel");
    // Ended jobs give back their plan (device buffer, pinned tables) as they end, not when the
    // GPU next idles: at most the transfers not yet waited for (plus the one just ended, which
    // may be a moment behind its waiter) hold one.
    auto stats = cl.GetStats();
    REQUIRE(stats.ok());
    for (const auto& e : stats->engines()) {
      const size_t at = e.find(" jobs set up");
      if (e.rfind("cuda:0", 0) != 0 || at == std::string::npos) continue;
      size_t begin = at;
      while (begin > 0 && std::isdigit(static_cast<unsigned char>(e[begin - 1]))) --begin;
      const size_t held = std::stoul(e.substr(begin, at - begin));
      INFO(e);
      CHECK(held <= ids.size() - k);
    }
  }
  const std::vector<uint8_t> got = d.Read(dst_bytes);
  size_t wrong = 0;
  for (uint32_t k = 0; k < kTransfers; ++k) {
    for (uint32_t j = 0; j < kPerTransfer; ++j) {
      const uint8_t* want = src.data() + uint64_t{from[k][j]} * 1024;
      const uint8_t* have = got.data() + (uint64_t{k} * kPerTransfer + j) * 1024;
      wrong += std::memcmp(want, have, 1024) != 0;
    }
  }
  CHECK(wrong == 0);
}

// Tables past defer_id_checks_from (32768 ids by default) are checked by the dispatcher as
// batches start: an id past the pool (an out-of-bounds GPU store if it reached the kernel) or a
// repeated destination id fails the transfer with the planner's message; blocks it never named
// stay untouched; the GPU context stays healthy (the next transfer moves, verified).
TEST_CASE("CUDA engine: deferred id checks stop bad ids in large tables before the GPU sees them") {
  if (!HaveGpu()) return;
  testing::LiveDaemon live;
  client::Client& cl = *live.client;
  constexpr uint32_t kBlocks = 40000;  // 40000 + 40000 ids: deferred
  const v1::PagedKvLayout layout = testing::MakeLayout(1, 1, kBlocks, 8, 1, 64, v1::DTYPE_BF16,
                                                       v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const uint64_t bytes = testing::LayoutBytes(layout);
  std::mt19937_64 rng(91);
  std::vector<uint8_t> src(bytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  Side s = MakeSide(cl, Kind::kGpu, &layout, bytes, false, src);
  const Kind dst_kind = client::CudaDeviceCount() >= 2 ? Kind::kGpu1 : Kind::kGpu;
  Side d = MakeSide(cl, dst_kind, &layout, bytes, true, std::vector<uint8_t>(bytes, kPoison));
  std::vector<uint32_t> from(kBlocks), to(kBlocks);
  std::iota(from.begin(), from.end(), 0);
  std::iota(to.begin(), to.end(), 0);
  std::shuffle(from.begin(), from.end(), rng);
  std::shuffle(to.begin(), to.end(), rng);
  const std::vector<uint32_t> named(to.begin(), to.begin() + kBlocks - 100);
  // Only the first kBlocks - 100 destination blocks are named: the last 100 must stay poison.
  std::vector<uint32_t> src_ids(from.begin(), from.begin() + kBlocks - 100);
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<uint32_t> dst_ids = named;
    std::string want;
    if (variant == 0) {
      dst_ids[39000] = kBlocks + 7;
      want = "spec.dst.block_ids[39000]: block 40007 out of range [0, 40000)";
    } else {
      dst_ids[39500] = dst_ids[12];
      want = "spec.dst.block_ids[39500]: block " + std::to_string(dst_ids[12]) +
             " repeats spec.dst.block_ids[12]";
    }
    auto submitted = cl.Submit(
        client::MakeBlockTransfer(s.info.region_id(), src_ids, d.info.region_id(), dst_ids));
    INFO(submitted.status().ToString());
    REQUIRE(submitted.ok());  // accepted: the ids are checked as batches start
    auto status = cl.Wait(submitted->transfer_id(), absl::Seconds(30));
    REQUIRE(status.ok());
    INFO(status->DebugString());
    CHECK(status->state() == v1::TRANSFER_STATE_FAILED);
    CHECK(status->error_code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
    CHECK(status->error_message().rfind(want, 0) == 0);
    const std::vector<uint8_t> got = d.Read(bytes);
    // Blocks the transfer never named hold the poison; named blocks hold either the poison or
    // their source block (batches before the bad id's may have moved).
    size_t touched_unnamed = 0, wrong_named = 0;
    std::vector<int64_t> source_of(kBlocks, -1);
    for (size_t j = 0; j < dst_ids.size(); ++j) {
      if (dst_ids[j] < kBlocks && source_of[dst_ids[j]] < 0) source_of[dst_ids[j]] = src_ids[j];
    }
    for (uint32_t b = 0; b < kBlocks; ++b) {
      const uint8_t* have = got.data() + uint64_t{b} * 1024;
      const bool poison = std::all_of(have, have + 1024, [](uint8_t x) { return x == kPoison; });
      if (source_of[b] < 0) {
        touched_unnamed += !poison;
      } else if (!poison) {
        wrong_named += std::memcmp(have, src.data() + uint64_t(source_of[b]) * 1024, 1024) != 0;
      }
    }
    CHECK(touched_unnamed == 0);
    CHECK(wrong_named == 0);
  }
  // Still healthy: the valid table moves, every block verified.
  auto good =
      cl.Submit(client::MakeBlockTransfer(s.info.region_id(), src_ids, d.info.region_id(), named));
  REQUIRE(good.ok());
  auto status = cl.Wait(good->transfer_id(), absl::Seconds(30));
  REQUIRE(status.ok());
  INFO(status->DebugString());
  REQUIRE(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(status->engine() == "cuda-kernel");
  const std::vector<uint8_t> got = d.Read(bytes);
  size_t wrong = 0;
  for (size_t j = 0; j < named.size(); ++j) {
    wrong += std::memcmp(got.data() + uint64_t{named[j]} * 1024,
                         src.data() + uint64_t{src_ids[j]} * 1024, 1024) != 0;
  }
  CHECK(wrong == 0);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("a client that dies while its GPU region is in use: the daemon keeps serving") {
  if (!HaveGpu()) return;
  testing::TempDir dir;
  testing::DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path()));
  const std::string info_path = dir.path() + "/prefill.json";
  // kv_demo prefill exports a GPU pool (GPU0) and holds it until killed.
  std::vector<std::string> args = {testing::RunfilePath("examples/kv_demo"),
                                   "prefill",
                                   "--socket",
                                   daemon.socket(),
                                   "--info",
                                   info_path,
                                   "--gpu",
                                   "0",
                                   "--ignore-stdin",
                                   "--tokens",
                                   "1024",
                                   "--pool-blocks",
                                   "128"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t prefill = -1;
  REQUIRE(posix_spawn(&prefill, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
  for (int i = 0; i < 600 && Slurp(info_path).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string info = Slurp(info_path);
  REQUIRE(!info.empty());
  const auto at = info.find("\"region_id\":");
  REQUIRE(at != std::string::npos);
  const uint64_t src_region = std::stoull(info.substr(at + 12));

  auto cl = client::Client::Connect(daemon.socket());
  REQUIRE(cl.ok());
  v1::PagedKvLayout layout = testing::MakeLayout(32, 2, 128, 16, 8, 128, v1::DTYPE_BF16,
                                                 v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const uint64_t bytes = testing::LayoutBytes(layout);
  Side dst = MakeSide(**cl, Kind::kGpu, &layout, bytes, true, std::vector<uint8_t>(bytes, kPoison));
  std::vector<uint32_t> blocks(64);
  for (uint32_t i = 0; i < 64; ++i) blocks[i] = i;
  v1::TransferSpec spec =
      client::MakeBlockTransfer(src_region, blocks, dst.info.region_id(), blocks);
  // The exporter's region belongs to its session: reading it takes the grant its info carries.
  const auto grant_at = info.find("\"grant\":");
  REQUIRE(grant_at != std::string::npos);
  const auto open = info.find('"', grant_at + 8);
  const auto close = info.find('"', open + 1);
  REQUIRE((open != std::string::npos && close != std::string::npos));
  spec.mutable_src()->set_grant(info.substr(open + 1, close - open - 1));
  spec.set_num_tokens(1024);
  spec.set_layerwise(true);
  auto submitted = (*cl)->Submit(spec);
  INFO(submitted.status().ToString());
  REQUIRE(submitted.ok());
  REQUIRE((*cl)->MarkReady(submitted->transfer_id(), 0, 16).ok());
  // The exporter dies with the transfer half done; its session ends, its region is unregistered,
  // but the running transfer keeps the daemon's mapping.
  ::kill(prefill, SIGKILL);
  ::waitpid(prefill, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    auto regions = (*cl)->ListRegions();
    REQUIRE(regions.ok());
    gone = true;
    for (const auto& r : regions->regions()) gone = gone && r.region_id() != src_region;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(gone);
  REQUIRE((*cl)->MarkReady(submitted->transfer_id(), 16, 16).ok());
  auto status = (*cl)->Wait(submitted->transfer_id(), absl::Seconds(30));
  REQUIRE(status.ok());
  WARN("transfer after the exporter died: " << v1::TransferState_Name(status->state()) << " "
                                            << status->error_message());
  CHECK(client::IsFinal(status->state()));
  // Mapping released once the transfer ended.
  bool closed = false;
  for (int i = 0; i < 100 && !closed; ++i) {
    closed = daemon.ReadLog().find("closed CUDA IPC mapping") != std::string::npos;
    if (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(closed);
  // Still serving: a fresh GPU -> GPU transfer between this client's regions succeeds.
  std::mt19937_64 rng(99);
  RunCase(**cl, planner::testing::RandomPagedCase(rng), Kind::kGpu, Kind::kGpu, rng, "");
  CHECK(daemon.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail
