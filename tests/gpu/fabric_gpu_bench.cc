// The fabric's GPU row: a GPU0 region under kvraild A -> a GPU1 region under kvraild B through the
// fabric path (libfabric tcp;ofi_rxm over loopback, host staging: A's copy engines pack tiles from
// GPU0 into its pinned send slots, B's unpack them from its receive slots into GPU1), verified
// block by block, beside in the same run: the same transfer between host regions over the same
// fabric (the provider's ceiling here), GPU0 -> GPU1 through one daemon (NVLink), and the PCIe
// ceiling (contiguous cudaMemcpyAsync GPU0 -> pinned host). Prints one table.
// Usage: fabric_gpu_bench [--mib 256] [--reps 3]. Needs daemon/kvraild via TEST_SRCDIR.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "tests/gpu/bench_check.h"
#include "tests/harness/daemon_process.h"
#include "tests/netns/netns.h"

namespace kvrail {
namespace {

using Clock = std::chrono::steady_clock;

using gpu_bench::Check;

// One side's pool: host buffer or GPU buffer, registered with `c`.
struct Pool {
  std::unique_ptr<client::HostBuffer> host;
  std::unique_ptr<client::CudaBuffer> gpu;
  v1::RegionInfo info;
  uint64_t bytes = 0;
  std::vector<uint8_t> Read() const {
    std::vector<uint8_t> out(bytes);
    if (gpu) {
      Check(cudaMemcpy(out.data(), gpu->data(), bytes, cudaMemcpyDeviceToHost), "read");
    } else {
      std::memcpy(out.data(), host->data(), bytes);
    }
    return out;
  }
};

Pool MakePool(client::Client& c, const v1::PagedKvLayout& layout, int gpu, bool writable,
              const std::vector<uint8_t>& content) {
  Pool p;
  p.bytes = testing::LayoutBytes(layout);
  v1::RegionSpec spec;
  *spec.mutable_paged_kv() = layout;
  spec.set_writable(writable);
  absl::StatusOr<v1::RegionInfo> info;
  if (gpu >= 0) {
    auto b = client::CudaBuffer::Create(gpu, p.bytes);
    if (!b.ok()) std::exit(1);
    p.gpu = *std::move(b);
    if (!p.gpu->CopyFromHost(0, content.data(), p.bytes).ok()) std::exit(1);
    info = client::RegisterCudaRegion(c, p.gpu->data(), p.bytes, spec);
  } else {
    auto b = c.CreateHostBuffer(p.bytes);
    if (!b.ok()) std::exit(1);
    p.host = *std::move(b);
    std::memcpy(p.host->data(), content.data(), p.bytes);
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(p.bytes);
    info = c.RegisterHostBuffer(*p.host, spec);
  }
  if (!info.ok()) {
    std::fprintf(stderr, "register: %s\n", info.status().ToString().c_str());
    std::exit(1);
  }
  p.info = *info;
  return p;
}

struct Result {
  gpu_bench::Spread gbps;
  std::string path, error;
};

// Moves `blocks` of `layout` from a pool on A (GPU `src_gpu` or host) to a pool on B (or on A
// when `a_to_a`), GB/s of each of `reps` after a verified warm-up.
Result Run(testing::NsDaemon& a, testing::NsDaemon& b, const v1::PagedKvLayout& layout, int src_gpu,
           int dst_gpu, bool a_to_a, int reps) {
  Result r;
  const uint64_t bytes = testing::LayoutBytes(layout);
  std::vector<uint8_t> content(bytes);
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    const uint64_t v = (i + 1) * 0x9E3779B97F4A7C15ull;
    std::memcpy(content.data() + 8 * i, &v, 8);
  }
  client::Client& dst_client = a_to_a ? *a.client : *b.client;
  Pool src = MakePool(*a.client, layout, src_gpu, false, content);
  Pool dst = MakePool(dst_client, layout, dst_gpu, true, std::vector<uint8_t>(bytes, 0));
  if (!a_to_a) {
    if (auto s = b.Export(dst.info.region_id(), "a"); !s.ok()) {
      r.error = "export: " + s.ToString();
      return r;
    }
  }
  const uint32_t n = layout.num_blocks();
  std::vector<uint32_t> sb(n), db(n);
  std::iota(sb.begin(), sb.end(), 0);
  std::iota(db.begin(), db.end(), 0);
  std::mt19937 rng(11);
  std::shuffle(sb.begin(), sb.end(), rng);
  std::shuffle(db.begin(), db.end(), rng);
  v1::TransferSpec spec =
      client::MakeBlockTransfer(src.info.region_id(), sb, dst.info.region_id(), db);
  if (!a_to_a) {
    spec.mutable_dst()->set_node_id("b");
    spec.mutable_dst()->set_grant(b.WriteGrant(dst.info.region_id()));
  }
  spec.set_timeout_ms(600000);
  std::vector<double> gbps;
  for (int rep = 0; rep <= reps; ++rep) {
    const auto t0 = Clock::now();
    auto sub = a.client->Submit(spec);
    if (!sub.ok()) {
      r.error = "submit: " + sub.status().ToString();
      return r;
    }
    auto st = a.client->Wait(sub->transfer_id());
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!st.ok() || st->state() != v1::TRANSFER_STATE_SUCCEEDED) {
      r.error = "transfer: " + (st.ok() ? st->error_message() : st.status().ToString());
      return r;
    }
    r.path = v1::Path_Name(st->path());
    if (rep == 0) {
      // Every (layer, part, block) element arrived where the block tables say.
      const std::vector<uint8_t> got = dst.Read();
      const uint64_t elem = testing::ElementOffset(layout, 0, 0, 1, 0, 0) -
                            testing::ElementOffset(layout, 0, 0, 0, 0, 0);
      for (uint32_t layer = 0; layer < layout.num_layers(); ++layer)
        for (uint32_t part = 0; part < layout.num_parts(); ++part)
          for (uint32_t i = 0; i < n; ++i) {
            const uint64_t from = testing::ElementOffset(layout, layer, part, sb[i], 0, 0);
            const uint64_t to = testing::ElementOffset(layout, layer, part, db[i], 0, 0);
            if (std::memcmp(content.data() + from, got.data() + to, elem) != 0) {
              r.error = "block " + std::to_string(i) + " of layer " + std::to_string(layer) +
                        " arrived wrong";
              return r;
            }
          }
      continue;
    }
    gbps.push_back(bytes / sec / 1e9);
  }
  r.gbps = gpu_bench::SpreadOf(gbps);
  (void)a.client->UnregisterRegion(src.info.region_id());
  (void)dst_client.UnregisterRegion(dst.info.region_id());
  return r;
}

gpu_bench::Spread PcieCeiling(uint64_t bytes) {
  Check(cudaSetDevice(0), "set device");
  void *d = nullptr, *h = nullptr;
  Check(cudaMalloc(&d, bytes), "malloc");
  Check(cudaMallocHost(&h, bytes), "malloc host");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> gbps;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost);
    cudaEventRecord(e1);
    Check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i > 0) gbps.push_back(bytes / (ms / 1e3) / 1e9);
  }
  cudaFree(d);
  cudaFreeHost(h);
  return gpu_bench::SpreadOf(gbps);
}

int Main(int argc, char** argv) {
  uint64_t mib = 256;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib") mib = std::stoull(argv[i + 1]);
    if (a == "--reps") reps = std::stoi(argv[i + 1]);
  }
  const int gpus = client::CudaDeviceCount();  // 0: only the host row runs
  const int dst_gpu = gpus >= 2 ? 1 : 0;
  // 32 layers x K/V x blocks of 16 tokens x 8 heads x 128 bf16 (32 KiB elements).
  const uint32_t blocks = static_cast<uint32_t>((mib << 20) / (32ull * 2 * 32768));
  const v1::PagedKvLayout layout = testing::MakeLayout(32, 2, blocks, 16, 8, 128, v1::DTYPE_BF16,
                                                       v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  testing::NsDaemonOptions oa;
  oa.nics = 2;
  oa.tile_bytes = 1 << 20;
  oa.slot_bytes = 1 << 20;
  oa.slots = 16;
  oa.log_level = "warn";
  testing::NsDaemonOptions ob = oa;
  oa.port = 7270;
  oa.peer_port = 7271;
  ob.port = 7271;
  ob.peer_port = 7270;
  testing::NsDaemon a, b;
  if (!a.Start("", "a", "127.0.0.1", "b", "127.0.0.1", oa) ||
      !b.Start("", "b", "127.0.0.1", "a", "127.0.0.1", ob)) {
    std::fprintf(stderr, "daemons did not start\n--- a:\n%s\n--- b:\n%s\n", a.Log().c_str(),
                 b.Log().c_str());
    return 1;
  }
  std::printf(
      "fabric GPU row: %lu MiB paged KV (32 layers x K/V x %u blocks x 32 KiB), tiles 1 MiB, "
      "2 lanes, tcp;ofi_rxm over loopback, %d GPU(s); GB/s median (min-max) of %d after a verified "
      "warm-up\n\n",
      static_cast<unsigned long>(mib), blocks, gpus, reps);
  std::printf("| what | GB/s | path |\n|---|---|---|\n");
  struct Case {
    std::string label;
    int src, dst;
    bool a_to_a;
  };
  std::vector<Case> cases = {
      {"GPU0 on A -> GPU" + std::to_string(dst_gpu) + " on B (fabric, host staging)", 0, dst_gpu,
       false},
      {"host on A -> host on B (fabric; the provider's ceiling here)", -1, -1, false},
      {"GPU0 on A -> host on B (fabric)", 0, -1, false},
      {"GPU0 -> GPU" + std::to_string(dst_gpu) + " through A alone (CUDA engine)", 0, dst_gpu,
       true},
  };
  if (gpus == 0) cases = {cases[1]};
  int failures = 0;
  for (const Case& c : cases) {
    const Result r = Run(a, b, layout, c.src, c.dst, c.a_to_a, reps);
    if (!r.error.empty()) {
      ++failures;
      std::printf("| %s | FAILED: %s | |\n", c.label.c_str(), r.error.c_str());
    } else {
      std::printf("| %s | %s | %s |\n", c.label.c_str(), gpu_bench::Cell(r.gbps, 2).c_str(),
                  r.path.c_str());
    }
    std::fflush(stdout);
  }
  if (gpus > 0) {
    std::printf("| PCIe ceiling: contiguous cudaMemcpyAsync GPU0 -> pinned host | %s | |\n",
                gpu_bench::Cell(PcieCeiling(mib << 20)).c_str());
  }
  if (failures > 0) {
    std::printf("\n--- a log (tail):\n%s\n--- b log (tail):\n%s\n",
                a.Log().substr(a.Log().size() > 3000 ? a.Log().size() - 3000 : 0).c_str(),
                b.Log().substr(b.Log().size() > 3000 ? b.Log().size() - 3000 : 0).c_str());
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvrail

int main(int argc, char** argv) { return kvrail::Main(argc, argv); }
