// The first transfer and the copy-engine-only mode through the real kvraild, sources on
// --src-gpu and destinations on --dst-gpu (GPU0 -> GPU0 by default):
//  1. First transfer after start against the warm rate: a fresh daemon, 512 MiB of scattered
//     16 KiB blocks, the first transfer then 20 more (median), with the engine's warm-up on
//     (default) and off (cuda_warm_up: false), each daemon started fresh.
//  2. Copy-engine-only mode (cuda_max_ctas 0): TP1 -> TP4 head split, HND -> NHD, block-major ->
//     NHD and aligned 16-token blocks; with the default cuda_copy_only_kernel_ctas (4: tiny-run
//     plans get a small kernel) and with 0 (copy engines regardless): GB/s, the engine that ran
//     and the path_reason the operator sees (bytes are checked by cuda_engine_gpu_test).
// Needs daemon/kvraild through TEST_SRCDIR/TEST_WORKSPACE, as the GPU tests do.
// Usage: first_transfer_bench [first|copy|all] [--src-gpu N] [--dst-gpu N]
#include <cuda_runtime_api.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "tests/gpu/bench_check.h"
#include "tests/gpu/bench_daemon.h"
#include "tests/harness/daemon_process.h"

namespace kvrail {
namespace {

using Clock = std::chrono::steady_clock;
using gpu_bench::Check;
using gpu_bench::Must;

gpu_bench::GpuPair g_pair;  // set once by main: sources on src, destinations on dst

// `config`: DaemonConfig textproto lines, then `args` (gpu_bench::BenchDaemon).
using Daemon = gpu_bench::BenchDaemon;

v1::PagedKvLayout Layout(v1::LayoutOrder order, uint32_t blocks, uint32_t tpb, uint32_t heads) {
  v1::PagedKvLayout l;
  l.set_num_layers(2);
  l.set_num_parts(2);
  l.set_num_blocks(blocks);
  l.set_tokens_per_block(tpb);
  l.set_num_heads(heads);
  l.set_head_dim(128);
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(order);
  return l;
}

uint64_t Bytes(const v1::PagedKvLayout& l) {
  return uint64_t{l.num_layers()} * l.num_parts() * l.num_blocks() * l.tokens_per_block() *
         l.num_heads() * l.head_dim() * 2;
}

std::vector<uint32_t> Scattered(uint32_t pool, uint32_t n, std::mt19937_64& rng) {
  std::vector<uint32_t> ids(pool);
  std::iota(ids.begin(), ids.end(), 0u);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n);
  return ids;
}

struct Pool {
  std::unique_ptr<client::CudaBuffer> buffer;
  v1::RegionInfo region;
};

Pool MakePool(Daemon& d, const v1::PagedKvLayout& layout, bool writable, const char* name) {
  Pool p;
  p.buffer = Must(client::CudaBuffer::Create(writable ? g_pair.dst : g_pair.src, Bytes(layout)),
                  "cuda buffer");
  if (!p.buffer->Fill(writable ? 0xAB : 0x5C).ok()) {
    std::fprintf(stderr, "fill failed\n");
    std::exit(1);
  }
  if (!writable) {
    // Distinct bytes so a misplaced vector shows: byte i = hash(i).
    std::vector<uint8_t> host(Bytes(layout));
    std::mt19937_64 rng(7);
    for (size_t i = 0; i < host.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(host.data() + i, &v, std::min<size_t>(8, host.size() - i));
    }
    Check(cudaMemcpy(p.buffer->data(), host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  }
  v1::RegionSpec spec;
  spec.set_name(name);
  spec.set_writable(writable);
  *spec.mutable_paged_kv() = layout;
  p.region = Must(client::RegisterCudaRegion(*d.client, p.buffer->data(), Bytes(layout), spec),
                  "register");
  return p;
}

struct Timed {
  double seconds = 0;
  v1::TransferStatus status;
};

Timed RunTransfer(Daemon& d, const v1::TransferSpec& spec) {
  Timed t;
  const auto t0 = Clock::now();
  auto submitted = Must(d.client->Submit(spec), "submit");
  t.status = Must(d.client->Wait(submitted.transfer_id(), absl::Seconds(600)), "wait");
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (t.status.state() != v1::TRANSFER_STATE_SUCCEEDED) {
    std::fprintf(stderr, "transfer failed: %s\n", t.status.ShortDebugString().c_str());
    std::exit(1);
  }
  return t;
}

// 1. First transfer vs warm.
void FirstVsWarm(bool warm_up) {
  Daemon d(warm_up ? "" : "cuda_warm_up: false", {});
  // 16 KiB blocks: 1 layer, 1 part, 16 tokens, 1 head, head_dim 512 (bf16).
  v1::PagedKvLayout l;
  l.set_num_layers(1);
  l.set_num_parts(1);
  l.set_num_blocks(65536);
  l.set_tokens_per_block(16);
  l.set_num_heads(1);
  l.set_head_dim(512);
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(d, l, false, "src");
  Pool dst = MakePool(d, l, true, "dst");
  std::mt19937_64 rng(1);
  const uint32_t n = 32768;  // 512 MiB
  std::vector<double> gbps;
  // Where the time went (daemon clock): submit -> first tile started, started -> finished.
  std::vector<int64_t> queued_us, running_us;
  std::string first_job;
  for (int i = 0; i < 21; ++i) {
    v1::TransferSpec spec =
        client::MakeBlockTransfer(src.region.region_id(), Scattered(65536, n, rng),
                                  dst.region.region_id(), Scattered(65536, n, rng));
    const Timed t = RunTransfer(d, spec);
    gbps.push_back(n * 16384.0 / t.seconds / 1e9);
    queued_us.push_back(t.status.started_unix_us() - t.status.submitted_unix_us());
    running_us.push_back(t.status.finished_unix_us() - t.status.started_unix_us());
    if (i == 0) {
      const std::string e = d.Engines();
      const size_t at = e.find("last job so far");
      first_job = at == std::string::npos ? "?" : e.substr(at);
    }
  }
  std::printf(
      "  first: %.0f us wall, daemon: %lld us submit -> started, %lld us started -> "
      "finished; its GPU account: %s\n",
      1e6 * n * 16384.0 / gbps[0] / 1e9, static_cast<long long>(queued_us[0]),
      static_cast<long long>(running_us[0]), first_job.c_str());
  std::vector<int64_t> wq(queued_us.begin() + 1, queued_us.end()),
      wr(running_us.begin() + 1, running_us.end());
  std::sort(wq.begin(), wq.end());
  std::sort(wr.begin(), wr.end());
  std::printf("  warm medians: %lld us submit -> started, %lld us started -> finished\n",
              static_cast<long long>(wq[wq.size() / 2]), static_cast<long long>(wr[wr.size() / 2]));
  const gpu_bench::Spread warm =
      gpu_bench::SpreadOf(std::vector<double>(gbps.begin() + 1, gbps.end()));
  std::printf("| %s | %.1f | %s | %.0f%% |\n", warm_up ? "on (default)" : "off", gbps[0],
              gpu_bench::Cell(warm).c_str(), 100 * gbps[0] / warm.median);
  std::printf("  engine: %s\n", d.Engines().c_str());
  std::fflush(stdout);
}

struct CopyCase {
  std::string name;
  v1::PagedKvLayout src, dst;
  uint32_t heads, src_head_begin;
  uint32_t src_blocks, dst_blocks;  // blocks the transfer touches
};

// 2. Copy-engine-only mode.
void CopyOnly(const std::string& config, const std::string& label, bool small) {
  Daemon d(config, {});
  const auto NHD = v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD;
  const auto HND = v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND;
  const auto BNHD = v1::LAYOUT_ORDER_BLOCK_LAYER_PART_NHD;
  // small: 2 MiB-ish transfers (the copy engines move head vectors at ~0.05 GB/s); else 64 MiB.
  const uint32_t blocks = small ? 32 : 1024;
  const uint32_t pool = 4096;
  std::vector<CopyCase> cases = {
      {"aligned NHD16 -> NHD16", Layout(NHD, pool, 16, 8), Layout(NHD, pool, 16, 8), 8, 0, blocks,
       blocks},
      {"TP1 -> TP4 (heads 6..7)", Layout(NHD, pool, 16, 8), Layout(NHD, pool, 16, 2), 2, 6, blocks,
       blocks},
      {"HND16 -> NHD16", Layout(HND, pool, 16, 8), Layout(NHD, pool, 16, 8), 8, 0, blocks, blocks},
      {"block-major NHD -> NHD", Layout(BNHD, pool, 16, 8), Layout(NHD, pool, 16, 8), 8, 0, blocks,
       blocks},
  };
  std::mt19937_64 rng(2);
  for (const CopyCase& c : cases) {
    Pool src = MakePool(d, c.src, false, "src");
    Pool dst = MakePool(d, c.dst, true, "dst");
    v1::TransferSpec spec =
        client::MakeBlockTransfer(src.region.region_id(), Scattered(pool, c.src_blocks, rng),
                                  dst.region.region_id(), Scattered(pool, c.dst_blocks, rng));
    spec.set_num_heads(c.heads);
    spec.mutable_src()->set_head_begin(c.src_head_begin);
    RunTransfer(d, spec);  // warm (plan shapes, tuner)
    const Timed t = RunTransfer(d, spec);
    const double bytes = static_cast<double>(t.status.bytes_done());
    std::printf("| %s | %s | %.1f | %.2f | %s | %s |\n", label.c_str(), c.name.c_str(),
                bytes / 1048576.0, bytes / t.seconds / 1e9, t.status.engine().c_str(),
                t.status.path_reason().c_str());
    std::fflush(stdout);
  }
  std::printf("  engine: %s\n", d.Engines().c_str());
}

}  // namespace
}  // namespace kvrail

int main(int argc, char** argv) {
  using namespace kvrail;
  g_pair = gpu_bench::TakeGpuPair(&argc, argv);
  const std::string part = argc > 1 ? argv[1] : "all";
  const std::string where = g_pair.Name();
  if (part == "all" || part == "first") {
    std::printf(
        "\n1. First transfer after start vs warm (512 MiB of scattered 16 KiB blocks, %s, "
        "submit -> completion, a fresh kvraild each row)\n\n",
        where.c_str());
    std::printf(
        "| warm-up | first GB/s | warm GB/s: median (min-max) of 20 | first / warm |\n"
        "|---|---|---|---|\n");
    FirstVsWarm(true);
    FirstVsWarm(false);
    FirstVsWarm(true);
  }
  if (part == "all" || part == "copy") {
    std::printf("\n2. Copy-engine-only mode (cuda_max_ctas 0), %s, second of two runs\n\n",
                where.c_str());
    std::printf(
        "| setting | layout | MiB | GB/s | engine | path_reason |\n|---|---|---|---|---|---|\n");
    CopyOnly("cuda_max_ctas: 0", "cuda_copy_only_kernel_ctas 4 (default)", false);
    CopyOnly("cuda_max_ctas: 0 cuda_copy_only_kernel_ctas: 0", "cuda_copy_only_kernel_ctas 0",
             true);
    CopyOnly("", "kernel mode (budget 32), for reference", false);
  }
  return 0;
}
