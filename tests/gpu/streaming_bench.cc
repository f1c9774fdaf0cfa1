// Layer-wise streaming and priorities on the GPU machine, one program, printed tables:
//  1. Layer-wise streaming: a simulated 32-layer prefill (one kernel per layer of known duration,
//     each writing that layer's KV: Llama-3-8B shape, 4096 tokens, 16 MiB per layer) whose stream
//     marks each layer ready with cuStreamWriteValue32 on a shared flag word; kvraild moves each
//     layer as its flag flips and writes an arrival flag per layer. Measured: time from the end of
//     prefill (last ready flag seen) to the last arrival flag, vs a bulk transfer submitted after
//     prefill; and one layer's transfer alone.
//  2. Priorities: 16 MiB critical transfers while an 8 GiB background transfer runs, vs the same
//     transfers in the background's class (FIFO behind it), vs an idle engine.
// Sources (and the simulated prefill) on --src-gpu, destinations on --dst-gpu (GPU0 -> GPU0 by
// default; KVRAIL_GPU_PAIR as tests/gpu/run.sh sets it). Rows print p50 with min and max.
// Outside Bazel: TEST_SRCDIR/TEST_WORKSPACE point at a folder holding daemon/kvraild.
// Flags: --stream-wait 1 starts kvraild with `cuda_stream_wait: true` (layer-wise
// layers wait on the GPU, cuStreamWaitValue32, instead of the readiness poller); --reps N
// streaming repetitions (first one not counted; default 6); --streaming-only skips part 2.
// Besides the tail it prints every other layer's lag (its ready word seen by the host -> its
// arrival word seen), so a per-layer cost shows apart from the last layer's.
#include <cuda_runtime_api.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/cuda_export.h"
#include "client/cuda_flags.h"
#include "client/kvrail_client.h"
#include "tests/gpu/bench_check.h"
#include "tests/gpu/prefill_sim.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::gpu_test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kLayers = 32, kParts = 2, kTpb = 16, kHeads = 8, kHeadDim = 128;
constexpr uint32_t kPromptBlocks = 256;                                   // 4096 tokens
constexpr uint64_t kBlockBytes = uint64_t{kTpb} * kHeads * kHeadDim * 2;  // 32 KiB
constexpr uint64_t kLayerBytes = kBlockBytes * kPromptBlocks * kParts;    // 16 MiB

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }
double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

#define CHECK_OK(expr)                                                                \
  do {                                                                                \
    auto _s = (expr);                                                                 \
    if (!_s.ok()) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, _s.ToString().c_str()); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)
#define CHECK_CUDA(expr)                                                               \
  do {                                                                                 \
    cudaError_t _e = (expr);                                                           \
    if (_e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(_e)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

v1::RegionSpec PagedSpec(uint32_t blocks, bool writable, const char* name) {
  v1::RegionSpec spec;
  spec.set_name(name);
  spec.set_writable(writable);
  auto* l = spec.mutable_paged_kv();
  l->set_num_layers(kLayers);
  l->set_num_parts(kParts);
  l->set_num_blocks(blocks);
  l->set_tokens_per_block(kTpb);
  l->set_num_heads(kHeads);
  l->set_head_dim(kHeadDim);
  l->set_dtype(v1::DTYPE_BF16);
  l->set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return spec;
}

uint64_t PoolBytes(uint32_t blocks) { return kBlockBytes * blocks * kParts * kLayers; }

bool Reached(const uint32_t* word, uint32_t value) {
  return static_cast<int32_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) >= 0;
}

void SpinUntil(volatile uint32_t* word, uint32_t value) {
  while (static_cast<int32_t>(__atomic_load_n(const_cast<uint32_t*>(word), __ATOMIC_ACQUIRE) -
                              value) < 0) {
  }
}

int Main(int argc, char** argv) {
  const gpu_bench::GpuPair pair = gpu_bench::TakeGpuPair(&argc, argv);
  bool stream_wait = false, streaming_only = false;
  int reps = 6;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--stream-wait" && i + 1 < argc)
      stream_wait = std::string(argv[++i]) == "1";
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(2, std::atoi(argv[++i]));
    else if (a == "--streaming-only")
      streaming_only = true;
  }
  const int dst_device = pair.dst;
  testing::TempDir dir;
  testing::DaemonProcess daemon;
  std::vector<std::string> args;
  if (stream_wait) {
    const std::string config = dir.path() + "/stream_wait.textproto";
    std::ofstream(config) << "cuda_stream_wait: true\n";
    args = {"--config", config};
  }
  daemon.set_log_level("info");  // a benchmark: no per-transfer debug lines
  if (!daemon.Start(dir.path(), args)) {
    std::fprintf(stderr, "kvraild did not start:\n%s\n", daemon.ReadLog().c_str());
    return 1;
  }
  auto c = client::Client::Connect(daemon.socket());
  CHECK_OK(c.status());
  client::Client& cl = **c;

  // Pools: the prompt's 256 blocks on the source; a 512-block destination, scattered.
  auto src = client::CudaBuffer::Create(pair.src, PoolBytes(kPromptBlocks));
  auto dst = client::CudaBuffer::Create(dst_device, PoolBytes(2 * kPromptBlocks));
  CHECK_OK(src.status());
  CHECK_OK(dst.status());
  CHECK_OK((*dst)->Fill(0xAB));
  auto src_region = client::RegisterCudaRegion(cl, (*src)->data(), (*src)->size(),
                                               PagedSpec(kPromptBlocks, false, "prefill"));
  auto dst_region = client::RegisterCudaRegion(cl, (*dst)->data(), (*dst)->size(),
                                               PagedSpec(2 * kPromptBlocks, true, "decode"));
  CHECK_OK(src_region.status());
  CHECK_OK(dst_region.status());
  std::vector<uint32_t> src_blocks(kPromptBlocks), dst_blocks(2 * kPromptBlocks);
  std::iota(src_blocks.begin(), src_blocks.end(), 0);
  std::iota(dst_blocks.begin(), dst_blocks.end(), 0);
  std::shuffle(dst_blocks.begin(), dst_blocks.end(), std::mt19937(7));
  dst_blocks.resize(kPromptBlocks);

  // Flag words: ready at [0, 32), arrival at [256, 288), in a host buffer shared with kvraild.
  auto flag_buffer = cl.CreateHostBuffer(4096);
  CHECK_OK(flag_buffer.status());
  std::memset((*flag_buffer)->data(), 0, 4096);
  auto* words = reinterpret_cast<uint32_t*>((*flag_buffer)->data());
  v1::RegionSpec flag_spec;
  flag_spec.set_name("flags");
  flag_spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  flag_spec.set_writable(true);
  flag_spec.mutable_bytes();
  auto flags_region = cl.RegisterHostBuffer(**flag_buffer, flag_spec);
  CHECK_OK(flags_region.status());
  auto gpu_flags = client::CudaFlags::Map(words, 1024, pair.src);
  CHECK_OK(gpu_flags.status());

  CHECK_CUDA(cudaSetDevice(pair.src));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const uint64_t layer_ns = 400000;  // 400 us of "compute" per layer
  uint32_t epoch = 0;

  auto run_prefill = [&](uint32_t e, uint32_t seed) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      CHECK_CUDA(LaunchPrefillLayer((*src)->data() + l * kLayerBytes, kLayerBytes, l, seed,
                                    layer_ns, stream));
      CHECK_OK((*gpu_flags)->SignalOnStream(stream, l, e));
    }
  };
  auto verify = [&](uint32_t seed) -> bool {
    std::vector<uint8_t> got(kBlockBytes);
    for (uint32_t l = 0; l < kLayers; l += 7) {
      for (uint32_t p = 0; p < kParts; ++p) {
        for (uint32_t i = 0; i < kPromptBlocks; i += 17) {
          const uint64_t src_off =
              l * kLayerBytes + p * kBlockBytes * kPromptBlocks + i * kBlockBytes;
          const uint64_t dst_off = l * kBlockBytes * 2 * kPromptBlocks * kParts +
                                   p * kBlockBytes * 2 * kPromptBlocks +
                                   dst_blocks[i] * kBlockBytes;
          if (!(*dst)->CopyToHost(dst_off, got.data(), kBlockBytes).ok()) return false;
          for (uint64_t b = 0; b < kBlockBytes; ++b) {
            if (got[b] != PrefillByte(src_off - l * kLayerBytes + b, l, seed)) return false;
          }
        }
      }
    }
    return true;
  };
  auto base_spec = client::MakeBlockTransfer(src_region->region_id(), src_blocks,
                                             dst_region->region_id(), dst_blocks);
  base_spec.set_priority(v1::PRIORITY_CRITICAL);

  // --- 1. streaming vs bulk --------------------------------------------------------------------
  std::vector<double> stream_tail, bulk_tail, layer_alone, prefill_ms, layer_lag;
  bool all_verified = true;
  std::string stream_path_reason;
  for (int rep = 0; rep < reps; ++rep) {
    // Streaming: submit first (layer-wise, released by the GPU's flags), then run prefill.
    const uint32_t e = ++epoch;
    auto spec = base_spec;
    spec.mutable_ready_flags()->set_region_id(flags_region->region_id());
    spec.mutable_ready_flags()->set_byte_offset(0);
    spec.mutable_ready_flags()->set_value(e);
    spec.mutable_arrival_flags()->set_region_id(flags_region->region_id());
    spec.mutable_arrival_flags()->set_byte_offset(1024);
    spec.mutable_arrival_flags()->set_value(e);
    auto submitted = cl.Submit(spec);
    CHECK_OK(submitted.status());
    const auto t_start = Clock::now();
    run_prefill(e, rep);
    // Every layer's ready word and arrival word, each time stamped when first seen (one thread
    // spinning on both arrays): the last layer's pair is the tail; the others show whether the
    // tail is a per-layer cost or the last layer's own (the GPU stream wait).
    std::vector<Clock::time_point> ready_at(kLayers), arrived_at(kLayers);
    uint32_t next_ready = 0, next_arrived = 0;
    const auto give_up = t_start + std::chrono::seconds(10);
    while (next_arrived < kLayers) {
      const auto now = Clock::now();
      while (next_ready < kLayers && Reached(&words[next_ready], e)) ready_at[next_ready++] = now;
      while (next_arrived < next_ready && Reached(&words[256 + next_arrived], e)) {
        arrived_at[next_arrived++] = now;
      }
      if (now > give_up) {
        std::fprintf(stderr, "streaming: %u layers ready, %u arrived after 10 s\n", next_ready,
                     next_arrived);
        return 1;
      }
    }
    const auto t_end = ready_at[kLayers - 1];
    const auto t_all = arrived_at[kLayers - 1];
    if (rep > 0) {
      for (uint32_t l = 0; l + 1 < kLayers; ++l) {
        layer_lag.push_back(Us(arrived_at[l] - ready_at[l]));
      }
    }
    auto st = cl.Wait(submitted->transfer_id(), absl::Seconds(10));
    CHECK_OK(st.status());
    if (st->state() != v1::TRANSFER_STATE_SUCCEEDED || !verify(rep)) all_verified = false;
    stream_path_reason = st->path_reason();
    if (st->state() != v1::TRANSFER_STATE_SUCCEEDED) {
      std::fprintf(stderr, "streaming transfer: %s\n", st->error_message().c_str());
    }
    if (rep > 0) {
      stream_tail.push_back(Us(t_all - t_end));
      prefill_ms.push_back(Us(t_end - t_start) / 1000);
    }
    // Bulk: prefill first, then one transfer of everything.
    CHECK_OK((*dst)->Fill(0xAB));
    const uint32_t e2 = ++epoch;
    run_prefill(e2, rep + 100);
    SpinUntil(&words[kLayers - 1], e2);
    const auto b_end = Clock::now();
    auto bulk = cl.Submit(base_spec);
    CHECK_OK(bulk.status());
    auto bst = cl.Wait(bulk->transfer_id(), absl::Seconds(10));
    const auto b_done = Clock::now();
    CHECK_OK(bst.status());
    if (bst->state() != v1::TRANSFER_STATE_SUCCEEDED || !verify(rep + 100)) all_verified = false;
    if (rep > 0) bulk_tail.push_back(Us(b_done - b_end));
    // One layer alone (16 MiB), submit to completion.
    auto one = base_spec;
    one.set_num_layers(1);
    one.mutable_src()->set_layer_begin(kLayers - 1);
    one.mutable_dst()->set_layer_begin(kLayers - 1);
    const auto o0 = Clock::now();
    auto os = cl.Submit(one);
    CHECK_OK(os.status());
    CHECK_OK(cl.Wait(os->transfer_id(), absl::Seconds(10)).status());
    if (rep > 0) layer_alone.push_back(Us(Clock::now() - o0));
  }
  std::printf(
      "kvrail streaming benchmark: %s, Llama-3-8B KV (32 layers x 16 MiB), "
      "%llu us per simulated layer\n\n",
      pair.Name().c_str(), static_cast<unsigned long long>(layer_ns / 1000));
  std::printf("1. from the end of prefill to all KV arrived (p50 / min / max over %zu runs)\n",
              stream_tail.size());
  std::printf("   %-44s %10.1f us %10.1f us %10.1f us\n",
              "layer-wise streaming (GPU flags, no RPC/layer)", Pct(stream_tail, 0.5),
              Pct(stream_tail, 0), Pct(stream_tail, 1.0));
  std::printf("   %-44s %10.1f us %10.1f us %10.1f us (p90 %.1f, %zu layers)\n",
              "layers 0-30: ready seen -> arrival seen", Pct(layer_lag, 0.5), Pct(layer_lag, 0),
              Pct(layer_lag, 1.0), Pct(layer_lag, 0.9), layer_lag.size());
  std::printf("   %-44s %10.1f us %10.1f us %10.1f us\n", "bulk transfer submitted after prefill",
              Pct(bulk_tail, 0.5), Pct(bulk_tail, 0), Pct(bulk_tail, 1.0));
  std::printf("   %-44s %10.1f us %10.1f us %10.1f us\n", "one 16 MiB layer alone (submit -> done)",
              Pct(layer_alone, 0.5), Pct(layer_alone, 0), Pct(layer_alone, 1.0));
  std::printf("   target: streaming tail <= one layer's transfer + 50 us = %.1f us -> %s\n",
              Pct(layer_alone, 0.5) + 50,
              Pct(stream_tail, 0.5) <= Pct(layer_alone, 0.5) + 50 ? "met" : "MISSED");
  std::printf("   prefill itself: %.2f ms p50; data verified: %s\n", Pct(prefill_ms, 0.5),
              all_verified ? "yes" : "NO");
  std::printf("   kvraild: cuda_stream_wait %s; the streaming transfer's path_reason: %s\n",
              stream_wait ? "true" : "false", stream_path_reason.c_str());
  std::printf("   streaming tails (us, in order):");
  for (double t : stream_tail) std::printf(" %.1f", t);
  std::printf("\n\n");
  if (streaming_only) {
    c->reset();
    daemon.Stop(SIGTERM);
    return all_verified ? 0 : 1;
  }

  // --- 2. priorities -----------------------------------------------------------------------
  const uint32_t bg_blocks = 4096;  // 8 GiB per pool
  auto bg_src = client::CudaBuffer::Create(pair.src, PoolBytes(bg_blocks));
  auto bg_dst = client::CudaBuffer::Create(dst_device, PoolBytes(bg_blocks));
  CHECK_OK(bg_src.status());
  CHECK_OK(bg_dst.status());
  auto bg_src_r = client::RegisterCudaRegion(cl, (*bg_src)->data(), (*bg_src)->size(),
                                             PagedSpec(bg_blocks, false, "bg-src"));
  auto bg_dst_r = client::RegisterCudaRegion(cl, (*bg_dst)->data(), (*bg_dst)->size(),
                                             PagedSpec(bg_blocks, true, "bg-dst"));
  CHECK_OK(bg_src_r.status());
  CHECK_OK(bg_dst_r.status());
  std::vector<uint32_t> bg_ids(bg_blocks), bg_dst_ids(bg_blocks);
  std::iota(bg_ids.begin(), bg_ids.end(), 0);
  bg_dst_ids = bg_ids;
  std::shuffle(bg_dst_ids.begin(), bg_dst_ids.end(), std::mt19937(3));
  auto bg_spec =
      client::MakeBlockTransfer(bg_src_r->region_id(), bg_ids, bg_dst_r->region_id(), bg_dst_ids);
  bg_spec.set_priority(v1::PRIORITY_BACKGROUND);
  auto crit = base_spec;
  crit.set_num_layers(1);

  auto measure = [&](bool with_background, v1::Priority p, int n, uint64_t* bg_id) {
    std::vector<double> us;
    *bg_id = 0;
    if (with_background) {
      auto bg = cl.Submit(bg_spec);
      CHECK_OK(bg.status());
      *bg_id = bg->transfer_id();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    auto spec = crit;
    spec.set_priority(p);
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      auto s = cl.Submit(spec);
      CHECK_OK(s.status());
      CHECK_OK(cl.Wait(s->transfer_id(), absl::Seconds(30)).status());
      us.push_back(Us(Clock::now() - t0));
      if (with_background) {
        auto bgs = cl.Get(*bg_id);
        CHECK_OK(bgs.status());
        if (bgs->state() == v1::TRANSFER_STATE_SUCCEEDED) break;  // only samples under load count
      }
    }
    if (*bg_id != 0) CHECK_OK(cl.Wait(*bg_id, absl::Seconds(60)).status());
    return us;
  };
  uint64_t bg_id = 0;
  auto idle = measure(false, v1::PRIORITY_CRITICAL, 30, &bg_id);
  auto prio = measure(true, v1::PRIORITY_CRITICAL, 1000, &bg_id);
  auto bg_status = cl.Get(bg_id);
  CHECK_OK(bg_status.status());
  const double bg_gbps = bg_status->bytes_total() /
                         ((bg_status->finished_unix_us() - bg_status->submitted_unix_us()) * 1e3);
  auto fifo = measure(true, v1::PRIORITY_BACKGROUND, 1000, &bg_id);
  std::printf(
      "2. 16 MiB critical transfers, submit -> done, beside an 8 GiB background transfer\n");
  std::printf("   %-36s %8s %10s %10s %10s %10s\n", "", "samples", "p50 us", "p99 us", "min us",
              "max us");
  for (const auto& [label, v] :
       {std::pair<const char*, const std::vector<double>*>{"idle engine", &idle},
        {"critical class (priorities)", &prio},
        {"same class as the background (FIFO)", &fifo}}) {
    std::printf("   %-36s %8zu %10.1f %10.1f %10.1f %10.1f\n", label, v->size(), Pct(*v, 0.5),
                Pct(*v, 0.99), Pct(*v, 0), Pct(*v, 1.0));
  }
  std::printf("   background transfer alone moved at %.1f GB/s (8 GiB, submit -> done)\n", bg_gbps);
  std::printf("   target: critical p99 <= 2x idle p99 (%.1f us) -> %s\n", 2 * Pct(idle, 0.99),
              Pct(prio, 0.99) <= 2 * Pct(idle, 0.99) ? "met" : "MISSED");
  c->reset();
  daemon.Stop(SIGTERM);
  return all_verified ? 0 : 1;
}

}  // namespace
}  // namespace kvrail::gpu_test

int main(int argc, char** argv) { return kvrail::gpu_test::Main(argc, argv); }
