// Across two daemons on one GPU machine (tcp;ofi_rxm over loopback),
// GPU -> GPU with a head split and an HND<->NHD conversion, against host -> host on the same path
// in the same run (target: >= 90%). The GPU rows run through the fabric kernels (the sender's GPU
// gathers into the mapped send slot and writes the command ring; the receiver's GPU scatters from
// the mapped receive slot); a second daemon pair started with KVRAIL_FABRIC_GPU_PACK=copy gives
// the copy-engine path for comparison. Every run's first repetition is verified element by
// element. The source is 32 layers x K/V x 16-token blocks x 8 heads x 128 bf16 in NHD; the
// destination takes heads [4, 8) (TP1 -> TP2) into 32-token blocks of 4 heads in HND
// (block-major), tokens in shuffled blocks on both sides.
// Usage: fabric_kernel_bench [--mib 256] [--reps 3] [--src-gpu 0] [--dst-gpu 0] [--copy-pair 0]
// (--dst-gpu 1 on two GPUs). Rows print the median with min-max of the timed repetitions. Needs
// daemon/kvraild via TEST_SRCDIR.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

struct Pool {
  std::unique_ptr<client::HostBuffer> host;
  std::unique_ptr<client::CudaBuffer> gpu;
  v1::RegionInfo info;
  uint64_t bytes = 0;
  std::vector<uint8_t> Read() const {
    std::vector<uint8_t> out(bytes);
    if (gpu) {
      gpu_bench::Check(cudaMemcpy(out.data(), gpu->data(), bytes, cudaMemcpyDeviceToHost), "read");
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
  double gbps = 0;  // spread.median
  gpu_bench::Spread spread;
  std::string path, reason, error;
};

constexpr uint32_t kSrcHeads = 8, kDstHeads = 4, kHeadBegin = 4, kSrcTpb = 16, kDstTpb = 32;

// A -> B: `src_layout` blocks sb (all of them) -> `dst_layout` blocks db, heads [4, 8) -> [0, 4).
Result Run(testing::NsDaemon& a, testing::NsDaemon& b, const v1::PagedKvLayout& src_layout,
           const v1::PagedKvLayout& dst_layout, int src_gpu, int dst_gpu, int reps) {
  Result r;
  const uint64_t src_bytes = testing::LayoutBytes(src_layout);
  std::vector<uint8_t> content(src_bytes);
  for (uint64_t i = 0; i < src_bytes / 8; ++i) {
    const uint64_t v = (i + 1) * 0x9E3779B97F4A7C15ull;
    std::memcpy(content.data() + 8 * i, &v, 8);
  }
  Pool src = MakePool(*a.client, src_layout, src_gpu, false, content);
  Pool dst = MakePool(*b.client, dst_layout, dst_gpu, true,
                      std::vector<uint8_t>(testing::LayoutBytes(dst_layout), 0));
  if (auto s = b.Export(dst.info.region_id(), "a"); !s.ok()) {
    r.error = "export: " + s.ToString();
    return r;
  }
  const uint32_t n = src_layout.num_blocks(), m = dst_layout.num_blocks();
  std::vector<uint32_t> sb(n), db(m);
  std::iota(sb.begin(), sb.end(), 0);
  std::iota(db.begin(), db.end(), 0);
  std::mt19937 rng(11);
  std::shuffle(sb.begin(), sb.end(), rng);
  std::shuffle(db.begin(), db.end(), rng);
  v1::TransferSpec spec =
      client::MakeBlockTransfer(src.info.region_id(), sb, dst.info.region_id(), db);
  spec.mutable_dst()->set_node_id("b");
  spec.mutable_dst()->set_grant(b.WriteGrant(dst.info.region_id()));
  spec.mutable_src()->set_head_begin(kHeadBegin);
  spec.set_num_heads(kDstHeads);
  spec.set_timeout_ms(120000);  // a stuck transfer fails instead of outwaiting the run
  const uint64_t moved = uint64_t{src_layout.num_layers()} * 2 * n * kSrcTpb * kDstHeads * 256;
  std::vector<double> gbps;
  for (int rep = 0; rep <= reps; ++rep) {
    const auto t0 = Clock::now();
    auto sub = a.client->Submit(spec);
    if (!sub.ok()) {
      r.error = "submit: " + sub.status().ToString();
      return r;
    }
    std::fprintf(stderr, "  rep %d: transfer %lu submitted\n", rep,
                 static_cast<unsigned long>(sub->transfer_id()));
    auto st = a.client->Wait(sub->transfer_id());
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!st.ok() || st->state() != v1::TRANSFER_STATE_SUCCEEDED) {
      r.error = "transfer: " + (st.ok() ? st->error_message() : st.status().ToString());
      return r;
    }
    r.path = v1::Path_Name(st->path());
    r.reason = st->path_reason();
    if (rep == 0) {
      // Every (layer, part, token, head) vector where the tables and the head split say.
      const std::vector<uint8_t> got = dst.Read();
      for (uint32_t layer = 0; layer < src_layout.num_layers(); ++layer)
        for (uint32_t part = 0; part < 2; ++part)
          for (uint64_t i = 0; i < uint64_t{n} * kSrcTpb; ++i)
            for (uint32_t h = 0; h < kDstHeads; ++h) {
              const uint64_t from = testing::ElementOffset(src_layout, layer, part, sb[i / kSrcTpb],
                                                           i % kSrcTpb, kHeadBegin + h);
              const uint64_t to =
                  testing::ElementOffset(dst_layout, layer, part, db[i / kDstTpb], i % kDstTpb, h);
              if (std::memcmp(content.data() + from, got.data() + to, 256) != 0) {
                r.error = "layer " + std::to_string(layer) + " token " + std::to_string(i) +
                          " head " + std::to_string(h) + " arrived wrong";
                return r;
              }
            }
      continue;
    }
    gbps.push_back(moved / sec / 1e9);
  }
  r.spread = gpu_bench::SpreadOf(gbps);
  r.gbps = r.spread.median;
  (void)a.client->UnregisterRegion(src.info.region_id());
  (void)b.client->UnregisterRegion(dst.info.region_id());
  return r;
}

bool StartPair(testing::NsDaemon& a, testing::NsDaemon& b, int port_a, int port_b) {
  testing::NsDaemonOptions oa;
  oa.nics = 2;
  oa.tile_bytes = 1 << 20;
  oa.slot_bytes = 1 << 20;
  oa.slots = 16;
  oa.log_level = "warn";
  testing::NsDaemonOptions ob = oa;
  oa.port = port_a;
  oa.peer_port = port_b;
  ob.port = port_b;
  ob.peer_port = port_a;
  if (!a.Start("", "a", "127.0.0.1", "b", "127.0.0.1", oa) ||
      !b.Start("", "b", "127.0.0.1", "a", "127.0.0.1", ob)) {
    std::fprintf(stderr, "daemons did not start\n--- a:\n%s\n--- b:\n%s\n", a.Log().c_str(),
                 b.Log().c_str());
    return false;
  }
  return true;
}

int Main(int argc, char** argv) {
  // Line-buffered even into a file, and progress on stderr: a run cut off by its timeout still
  // says how far it got.
  setvbuf(stdout, nullptr, _IOLBF, 0);
  uint64_t mib = 256;
  int reps = 3, src_gpu = 0, dst_gpu = 0;
  bool no_copy = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib") mib = std::stoull(argv[i + 1]);
    if (a == "--reps") reps = std::stoi(argv[i + 1]);
    if (a == "--src-gpu") src_gpu = std::stoi(argv[i + 1]);
    if (a == "--dst-gpu") dst_gpu = std::stoi(argv[i + 1]);
    if (a == "--copy-pair") no_copy = std::string(argv[i + 1]) == "0";
  }
  const int gpus = client::CudaDeviceCount();
  // Source blocks: `mib` MiB of source pool (8 heads), half of it (4 heads) moved.
  const uint32_t blocks =
      static_cast<uint32_t>((mib << 20) / (32ull * 2 * kSrcTpb * kSrcHeads * 256));
  const v1::PagedKvLayout src_layout =
      testing::MakeLayout(32, 2, blocks, kSrcTpb, kSrcHeads, 128, v1::DTYPE_BF16,
                          v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const v1::PagedKvLayout dst_layout =
      testing::MakeLayout(32, 2, (blocks * kSrcTpb + kDstTpb - 1) / kDstTpb, kDstTpb, kDstHeads,
                          128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND);
  testing::NsDaemon a, b, ca, cb;
  std::fprintf(stderr, "starting daemons a, b\n");
  if (!StartPair(a, b, 7370, 7371)) return 1;
  bool copy_pair = false;
  if (gpus > 0 && !no_copy) {
    std::fprintf(stderr, "starting the copy-engine pair (KVRAIL_FABRIC_GPU_PACK=copy)\n");
    setenv("KVRAIL_FABRIC_GPU_PACK", "copy", 1);
    copy_pair = StartPair(ca, cb, 7372, 7373);
    unsetenv("KVRAIL_FABRIC_GPU_PACK");
  }
  std::printf(
      "fabric kernel bench: %lu MiB source pool (32 layers x K/V x %u blocks x 16 tokens x "
      "8 heads x 128 bf16, NHD), heads 4-7 -> 4-head 32-token HND blocks (TP1->TP2 + "
      "NHD->HND), %.0f MiB moved, tiles 1 MiB, 2 lanes, tcp;ofi_rxm over loopback, %d "
      "GPU(s); GB/s median (min-max) of %d after a verified warm-up\n\n",
      static_cast<unsigned long>(mib), blocks,
      32.0 * 2 * blocks * kSrcTpb * kDstHeads * 256 / 1048576.0, gpus, reps);
  std::printf("| what | GB/s | vs host->host | path reason |\n|---|---|---|---|\n");
  struct Case {
    std::string label;
    int src, dst;
    bool copy;
  };
  const std::string g = "GPU" + std::to_string(src_gpu) + " on A -> GPU" + std::to_string(dst_gpu);
  std::vector<Case> cases = {
      {"host on A -> host on B (CPU pack/unpack)", -1, -1, false},
      {g + " on B (fabric kernels)", src_gpu, dst_gpu, false},
      // Each side alone: which side's GPU path costs what.
      {"GPU" + std::to_string(src_gpu) + " on A -> host on B (sender's kernel only)", src_gpu, -1,
       false},
      {"host on A -> GPU" + std::to_string(dst_gpu) + " on B (receiver's kernel only)", -1, dst_gpu,
       false},
      {g + " on B (copy engines, KVRAIL_FABRIC_GPU_PACK=copy)", src_gpu, dst_gpu, true},
      {"host on A -> host on B (again, after the GPU rows)", -1, -1, false},
  };
  if (gpus == 0) cases = {cases[0]};
  int failures = 0;
  double host = 0;
  for (const Case& c : cases) {
    if (c.copy && !copy_pair) continue;
    std::fprintf(stderr, "row: %s\n", c.label.c_str());
    const Result r = c.copy ? Run(ca, cb, src_layout, dst_layout, c.src, c.dst, reps)
                            : Run(a, b, src_layout, dst_layout, c.src, c.dst, reps);
    if (!r.error.empty()) {
      ++failures;
      std::printf("| %s | FAILED: %s | | |\n", c.label.c_str(), r.error.c_str());
    } else {
      if (c.src < 0 && host == 0) host = r.gbps;
      std::printf("| %s | %s | %.0f%% | %s: %s |\n", c.label.c_str(),
                  gpu_bench::Cell(r.spread, 2).c_str(), host > 0 ? 100.0 * r.gbps / host : 0.0,
                  r.path.c_str(), r.reason.c_str());
    }
    std::fflush(stdout);
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
