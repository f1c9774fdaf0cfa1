// CUDA engine benchmark on one GPU (same-GPU and GPU -> host transfers), printed as tables:
//  1. 1 GiB of randomly scattered blocks (4/16/32/128 KiB), end to end through kvraild (the
//     client submits over gRPC and waits), beside cudaMemcpyAsync per block, one
//     cudaMemcpyBatchAsync and the contiguous cudaMemcpyAsync ceiling, all in this process;
//  2. submit -> completion latency of a 16 MiB transfer (p50 / p90 of 50);
//  3. CTA sweep: fixed CTA counts, copy engines only, and the adaptive engine's choice;
//  4. GPU -> pinned host through kvraild.
// Usage: cuda_engine_bench [--quick]. Needs daemon/kvraild through TEST_SRCDIR/TEST_WORKSPACE
// (or the working directory), as the GPU tests do.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <csignal>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "tests/harness/daemon_process.h"

namespace kvrail {
namespace {

using Clock = std::chrono::steady_clock;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <typename T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

// A pool of `blocks` blocks of `block_bytes`: 1 layer, 1 part, 16 tokens, 1 head, bf16.
v1::PagedKvLayout BlockLayout(uint32_t blocks, uint64_t block_bytes) {
  v1::PagedKvLayout l;
  l.set_num_layers(1);
  l.set_num_parts(1);
  l.set_num_blocks(blocks);
  l.set_tokens_per_block(16);
  l.set_num_heads(1);
  l.set_head_dim(static_cast<uint32_t>(block_bytes / 16 / 2));
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return l;
}

std::vector<uint32_t> Scattered(uint32_t pool, uint32_t n, uint64_t seed) {
  std::vector<uint32_t> ids(pool);
  std::iota(ids.begin(), ids.end(), 0u);
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n);
  return ids;
}

double Gbps(uint64_t bytes, double seconds) { return bytes / seconds / 1e9; }

struct Daemon {
  testing::TempDir dir;
  testing::DaemonProcess process;
  std::unique_ptr<client::Client> client;
  explicit Daemon(const std::vector<std::string>& args) {
    std::vector<std::string> all;
    all.insert(all.end(), args.begin(), args.end());
    if (!process.Start(dir.path(), all)) {
      std::fprintf(stderr, "kvraild did not start:\n%s\n", process.ReadLog().c_str());
      std::exit(1);
    }
    client = Must(client::Client::Connect(process.socket()), "connect");
  }
  ~Daemon() { process.Stop(SIGTERM); }
  std::string Engines() {
    v1::Stats stats = Must(client->GetStats(), "stats");
    std::string out;
    for (const auto& e : stats.engines()) absl::StrAppend(&out, out.empty() ? "" : " | ", e);
    return out;
  }
};

// Source and destination pools on GPU0 (or the destination in host memory).
struct Pools {
  uint64_t block_bytes = 0;
  uint32_t pool_blocks = 0, moved = 0;
  std::unique_ptr<client::CudaBuffer> src, dst;
  std::unique_ptr<client::HostBuffer> host_dst;
  v1::RegionInfo src_info, dst_info;
  std::vector<uint32_t> src_blocks, dst_blocks;
};

Pools MakePools(Daemon& d, uint64_t block_bytes, uint64_t total, bool dst_host) {
  Pools p;
  p.block_bytes = block_bytes;
  p.moved = static_cast<uint32_t>(total / block_bytes);
  p.pool_blocks = 2 * p.moved;
  const v1::PagedKvLayout layout = BlockLayout(p.pool_blocks, block_bytes);
  const uint64_t bytes = uint64_t{p.pool_blocks} * block_bytes;
  p.src = Must(client::CudaBuffer::Create(0, bytes), "alloc src");
  Check(cudaMemset(p.src->data(), 1, bytes), "memset");
  v1::RegionSpec spec;
  *spec.mutable_paged_kv() = layout;
  spec.set_name("bench-src");
  p.src_info = Must(client::RegisterCudaRegion(*d.client, p.src->data(), bytes, spec), "reg src");
  spec.set_name("bench-dst");
  spec.set_writable(true);
  if (dst_host) {
    p.host_dst = Must(d.client->CreateHostBuffer(bytes), "host dst");
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(bytes);
    p.dst_info = Must(d.client->RegisterHostBuffer(*p.host_dst, spec), "reg host dst");
  } else {
    p.dst = Must(client::CudaBuffer::Create(0, bytes), "alloc dst");
    p.dst_info = Must(client::RegisterCudaRegion(*d.client, p.dst->data(), bytes, spec), "reg dst");
  }
  p.src_blocks = Scattered(p.pool_blocks, p.moved, 1);
  p.dst_blocks = Scattered(p.pool_blocks, p.moved, 2);
  Check(cudaDeviceSynchronize(), "sync");
  return p;
}

void Release(Daemon& d, Pools& p) {
  (void)d.client->UnregisterRegion(p.src_info.region_id());
  (void)d.client->UnregisterRegion(p.dst_info.region_id());
}

// One transfer of `blocks` blocks through kvraild; returns seconds (submit to completion).
double Through(Daemon& d, const Pools& p, uint32_t blocks, std::string* engine, std::string* path) {
  std::vector<uint32_t> s(p.src_blocks.begin(), p.src_blocks.begin() + blocks);
  std::vector<uint32_t> t(p.dst_blocks.begin(), p.dst_blocks.begin() + blocks);
  v1::TransferSpec spec =
      client::MakeBlockTransfer(p.src_info.region_id(), s, p.dst_info.region_id(), t);
  spec.set_num_tokens(uint64_t{blocks} * 16);
  const auto t0 = Clock::now();
  auto sub = Must(d.client->Submit(spec), "submit");
  auto st = Must(d.client->Wait(sub.transfer_id()), "wait");
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  if (st.state() != v1::TRANSFER_STATE_SUCCEEDED) {
    std::fprintf(stderr, "transfer failed: %s\n", st.error_message().c_str());
    std::exit(1);
  }
  if (engine) *engine = st.engine();
  if (path) *path = v1::Path_Name(st.path());
  return sec;
}

// Best of `reps` (after one warm-up) in GB/s.
double BestThrough(Daemon& d, const Pools& p, int reps, std::string* engine, std::string* path) {
  Through(d, p, p.moved, engine, path);
  double best = 1e9;
  for (int i = 0; i < reps; ++i) best = std::min(best, Through(d, p, p.moved, nullptr, nullptr));
  return Gbps(uint64_t{p.moved} * p.block_bytes, best);
}

double TimeStream(const std::function<void(cudaStream_t)>& body, int reps) {
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  body(s);
  Check(cudaStreamSynchronize(s), "warm-up");
  float best = 1e30f;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    body(s);
    cudaEventRecord(b, s);
    Check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return best / 1e3;
}

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const uint64_t total = quick ? (256ull << 20) : (1ull << 30);
  const int reps = quick ? 2 : 5;
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "props");
  std::printf("device: %s, %d SMs; %.0f MiB of scattered blocks per transfer\n", prop.name,
              prop.multiProcessorCount, total / 1048576.0);

  std::printf("\n## 1. same GPU, GB/s (best of %d)\n", reps);
  std::printf("| block | kvraild e2e | engine | per-block cudaMemcpyAsync | cudaMemcpyBatchAsync | contiguous ceiling |\n|---|---|---|---|---|---|\n");
  {
    Daemon d({"--cuda-max-ctas", "132"});
    for (uint64_t kib : {4, 16, 32, 128}) {
      Pools p = MakePools(d, kib << 10, total, false);
      std::string engine, path;
      const double e2e = BestThrough(d, p, reps, &engine, &path);
      std::vector<void*> dsts(p.moved);
      std::vector<const void*> srcs(p.moved);
      std::vector<size_t> sizes(p.moved, p.block_bytes);
      for (uint32_t i = 0; i < p.moved; ++i) {
        dsts[i] = p.dst->data() + uint64_t{p.dst_blocks[i]} * p.block_bytes;
        srcs[i] = p.src->data() + uint64_t{p.src_blocks[i]} * p.block_bytes;
      }
      const uint64_t bytes = uint64_t{p.moved} * p.block_bytes;
      const double per_block = TimeStream([&](cudaStream_t s) {
        for (uint32_t i = 0; i < p.moved; ++i) {
          cudaMemcpyAsync(dsts[i], srcs[i], p.block_bytes, cudaMemcpyDeviceToDevice, s);
        }
      }, quick ? 1 : 2);
      const double batch = TimeStream([&](cudaStream_t s) {
        cudaMemcpyAttributes attrs{};
        attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t idx = 0;
        Check(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), p.moved, &attrs, &idx,
                                   1, s), "batch");
      }, reps);
      const double contiguous = TimeStream([&](cudaStream_t s) {
        cudaMemcpyAsync(p.dst->data(), p.src->data(), bytes, cudaMemcpyDeviceToDevice, s);
      }, reps);
      std::printf("| %lu KiB | %.1f | %s (%s) | %.1f | %.1f | %.1f |\n", kib, e2e, engine.c_str(),
                  path.c_str(), Gbps(bytes, per_block), Gbps(bytes, batch),
                  Gbps(bytes, contiguous));
      std::fflush(stdout);
      Release(d, p);
    }
    std::printf("engines after table 1: %s\n", d.Engines().c_str());

    std::printf("\n## 2. 16 MiB transfer (16 KiB blocks), submit -> completion seen by the client\n");
    Pools p = MakePools(d, 16 << 10, 64ull << 20, false);
    std::vector<double> lat;
    for (int i = 0; i < 60; ++i) lat.push_back(Through(d, p, 1024, nullptr, nullptr));
    lat.erase(lat.begin(), lat.begin() + 10);
    std::sort(lat.begin(), lat.end());
    const double target = 100e-6 + (16 << 20) / 350e9;
    std::printf("p50 %.1f us, p90 %.1f us, min %.1f us (target p50 < %.1f us)\n",
                lat[lat.size() / 2] * 1e6, lat[lat.size() * 9 / 10] * 1e6, lat[0] * 1e6,
                target * 1e6);
    Release(d, p);
  }

  std::printf("\n## 3. SM budget sweep, same GPU, 16 KiB and 4 KiB blocks, GB/s through kvraild\n");
  std::printf("| daemon setting | 4 KiB | 16 KiB | engine |\n|---|---|---|---|\n");
  std::vector<std::pair<std::string, std::vector<std::string>>> settings = {
      {"copy engines only (budget 0)", {"--cuda-max-ctas", "0"}}};
  for (int c : {2, 4, 8, 16, 32, 64, 132}) {
    settings.push_back({absl::StrCat(c, " CTAs fixed"),
                        {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c)}});
  }
  settings.push_back({"adaptive, budget 32", {"--cuda-max-ctas", "32"}});
  settings.push_back({"adaptive, budget 132", {"--cuda-max-ctas", "132"}});
  for (const auto& [label, args] : settings) {
    Daemon d(args);
    double g[2];
    std::string engine;
    int k = 0;
    for (uint64_t kib : {4, 16}) {
      Pools p = MakePools(d, kib << 10, total / 2, false);
      // Adaptive daemons need a few batches to probe: run more before measuring.
      if (label.rfind("adaptive", 0) == 0) {
        for (int i = 0; i < 12; ++i) Through(d, p, p.moved, nullptr, nullptr);
      }
      g[k++] = BestThrough(d, p, reps, &engine, nullptr);
      Release(d, p);
    }
    std::printf("| %s | %.1f | %.1f | %s |\n", label.c_str(), g[0], g[1], engine.c_str());
    if (label.rfind("adaptive", 0) == 0) std::printf("  stats: %s\n", d.Engines().c_str());
    std::fflush(stdout);
  }

  std::printf("\n## 4. GPU0 -> pinned host memory through kvraild (32 KiB blocks)\n");
  {
    Daemon d({"--cuda-max-ctas", "32"});
    Pools p = MakePools(d, 32 << 10, total / 2, true);
    std::string engine, path;
    const double g = BestThrough(d, p, reps, &engine, &path);
    std::printf("%.1f GB/s, %s, %s\n", g, engine.c_str(), path.c_str());
    Release(d, p);
  }
  return 0;
}

}  // namespace
}  // namespace kvrail

int main(int argc, char** argv) { return kvrail::Main(argc, argv); }
