// CUDA engine benchmark, printed as tables. Blocks move from --src-gpu to --dst-gpu (GPU0 -> GPU0
// by default; KVRAIL_GPU_PAIR as tests/gpu/run.sh sets it; GPU0 -> GPU1 crosses NVLink). Every
// rate is the median with min-max of its runs; headline rows run kvraild at its shipped defaults
// (cuda_max_ctas 32), rows labelled "tuned" with the whole GPU (132 CTAs):
//  1. 1 GiB of randomly scattered blocks (4/16/32/128 KiB), end to end through kvraild (the
//     client submits over gRPC and waits), beside cudaMemcpyAsync per block, one
//     cudaMemcpyBatchAsync and the contiguous copy-engine ceiling, all in this process, and (two
//     GPUs) NCCL pack + send/recv + unpack through PyTorch (tests/gpu/nccl_baseline.py);
//  1b. a Llama-3-70B TP8-like layout (80 layers, K and V, 1 head, head_dim 128, bf16, 16 tokens);
//  2. submit -> completion latency of a 16 MiB transfer (p50 / p90 of 50);
//  3. CTA sweep: fixed CTA counts, copy engines only, and the adaptive engine's choice;
//  4. the source GPU -> pinned host through kvraild.
// With --interference (run it under MPS): an 8192^3 bf16 GEMM loop in another process on the
// source GPU (tests/gpu/gemm_load.py) beside transfers at several SM budgets and on the copy
// engines. With --gemm-pairs N (under MPS): the GEMM alone and beside back-to-back transfers at
// the shipped defaults, alternating, N pairs, so the noise shows beside the cost.
// --tables 1,1c,1b,2,3,4 runs only those tables (default all).
// Usage: cuda_engine_bench [--quick] [--tables LIST] [--interference] [--gemm-pairs N]
//        [--src-gpu N] [--dst-gpu N]. Needs daemon/kvraild through
// TEST_SRCDIR/TEST_WORKSPACE (or the working directory), as the GPU tests do; the Python helpers
// are found relative to the working directory (the repository root) and run with $PYTHON or
// python3.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "tests/gpu/bench_check.h"
#include "tests/harness/daemon_process.h"

namespace kvrail {
namespace {

using Clock = std::chrono::steady_clock;

using gpu_bench::Check;

using gpu_bench::Cell;
using gpu_bench::Must;
using gpu_bench::Spread;
using gpu_bench::SpreadOf;

int g_src = 0;  // the source GPU (--src-gpu): source pools, the GEMM load, this process's streams

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

// The text after `key` in the first GPU's line of GetStats' engines, up to `end` (exclusive) or
// the next engine; "?" when absent.
std::string EngineField(Daemon& d, const std::string& key, const std::string& end) {
  const std::string all = d.Engines();
  const size_t at = all.find(key);
  if (at == std::string::npos) return "?";
  const std::string rest = all.substr(at + key.size());
  return rest.substr(0, std::min(rest.find(end), rest.find(" | ")));
}

// The engine's account of the last job's batches ("N batches, GPU busy X of Y ms ...").
std::string LastJobBusy(Daemon& d) { return EngineField(d, "last job so far: ", ";"); }

// A client of `d` that submits over gRPC only (SubmitTransfer), as before the session socket
// carried submits; swap it into d.client for a measurement.
std::unique_ptr<client::Client> GrpcOnlyClient(Daemon& d) {
  ::setenv("KVRAIL_SUBMIT_VIA", "grpc", 1);
  auto c = Must(client::Client::Connect(d.process.socket()), "connect (gRPC only)");
  ::unsetenv("KVRAIL_SUBMIT_VIA");
  return c;
}

// Source pool on GPU g_src, destination on GPU `dst_device` (or in host memory).
struct Pools {
  uint64_t block_bytes = 0;
  uint32_t pool_blocks = 0, moved = 0;
  std::unique_ptr<client::CudaBuffer> src, dst;
  std::unique_ptr<client::HostBuffer> host_dst;
  v1::RegionInfo src_info, dst_info;
  std::vector<uint32_t> src_blocks, dst_blocks;
  // Set by UseTableRefs: both block tables already in registered host memory (the server keeps
  // its block tables there); transfers then name them with BlockTableRef instead of carrying ids.
  std::unique_ptr<client::HostBuffer> tables;
  uint64_t tables_region = 0;
  std::string src_grant, dst_grant;
};

Pools MakePoolsWith(Daemon& d, const v1::PagedKvLayout& layout, uint32_t moved, bool dst_host,
                    int dst_device) {
  Pools p;
  p.moved = moved;
  p.pool_blocks = layout.num_blocks();
  const uint64_t bytes = testing::LayoutBytes(layout);
  p.block_bytes = bytes / p.pool_blocks;
  p.src = Must(client::CudaBuffer::Create(g_src, bytes), "alloc src");
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
    p.dst = Must(client::CudaBuffer::Create(dst_device, bytes), "alloc dst");
    p.dst_info = Must(client::RegisterCudaRegion(*d.client, p.dst->data(), bytes, spec), "reg dst");
  }
  p.src_blocks = Scattered(p.pool_blocks, p.moved, 1);
  p.dst_blocks = Scattered(p.pool_blocks, p.moved, 2);
  // Grants of the pools' owner, so another client of the daemon (the gRPC-only rows) may move
  // them too; the owner's own transfers pass by ownership.
  p.src_grant =
      Must(d.client->CreateGrant(p.src_info.region_id(), v1::GRANT_ACCESS_READ, absl::Hours(24)),
           "grant src")
          .token();
  p.dst_grant =
      Must(d.client->CreateGrant(p.dst_info.region_id(), v1::GRANT_ACCESS_WRITE, absl::Hours(24)),
           "grant dst")
          .token();
  Check(cudaDeviceSynchronize(), "sync");
  Check(cudaSetDevice(g_src), "cudaSetDevice(--src-gpu)");
  return p;
}

Pools MakePools(Daemon& d, uint64_t block_bytes, uint64_t total, bool dst_host, int dst_device) {
  const uint32_t moved = static_cast<uint32_t>(total / block_bytes);
  return MakePoolsWith(d, BlockLayout(2 * moved, block_bytes), moved, dst_host, dst_device);
}

void Release(Daemon& d, Pools& p) {
  (void)d.client->UnregisterRegion(p.src_info.region_id());
  (void)d.client->UnregisterRegion(p.dst_info.region_id());
  if (p.tables_region != 0) (void)d.client->UnregisterRegion(p.tables_region);
}

// Writes both block tables into a registered host buffer once; later transfers reference them.
void UseTableRefs(Daemon& d, Pools& p) {
  const uint64_t bytes = 4 * (p.src_blocks.size() + p.dst_blocks.size());
  p.tables = Must(d.client->CreateHostBuffer(bytes), "tables buffer");
  std::memcpy(p.tables->data(), p.src_blocks.data(), 4 * p.src_blocks.size());
  std::memcpy(p.tables->data() + 4 * p.src_blocks.size(), p.dst_blocks.data(),
              4 * p.dst_blocks.size());
  v1::RegionSpec spec;
  spec.set_name("bench block tables");
  p.tables_region = Must(d.client->RegisterHostBuffer(*p.tables, spec), "reg tables").region_id();
}

// Where the time of the last Through() went, in ms: the Submit RPC (client side), accepted ->
// first tile started, started -> finished (daemon clock), finished -> the client saw it.
struct Phases {
  double submit_ms = 0, queued_ms = 0, running_ms = 0, notify_ms = 0;
  // The Submit RPC split: client -> the daemon's handler, the handler's accept work (validation,
  // planning, the record), and the handler's return -> the client holding the answer.
  double to_daemon_ms = 0, accept_ms = 0, reply_ms = 0;
};
Phases last_phases;

double UnixUs() { return absl::ToDoubleMicroseconds(absl::Now() - absl::UnixEpoch()); }

// The transfer of the first `blocks` entries of the pools' block tables.
v1::TransferSpec SpecFor(const Pools& p, uint32_t blocks) {
  if (p.tables_region != 0) {
    v1::TransferSpec spec =
        client::MakeBlockTransfer(p.src_info.region_id(), {}, p.dst_info.region_id(), {});
    auto* s = spec.mutable_src()->mutable_block_table();
    s->set_region_id(p.tables_region);
    s->set_offset_bytes(0);
    s->set_count(blocks);
    auto* t = spec.mutable_dst()->mutable_block_table();
    t->set_region_id(p.tables_region);
    t->set_offset_bytes(4 * p.src_blocks.size());
    t->set_count(blocks);
    spec.set_num_tokens(uint64_t{blocks} * 16);
    return spec;  // block tables in the owner's memory: the owner's transfers only
  }
  std::vector<uint32_t> s(p.src_blocks.begin(), p.src_blocks.begin() + blocks);
  std::vector<uint32_t> t(p.dst_blocks.begin(), p.dst_blocks.begin() + blocks);
  v1::TransferSpec spec =
      client::MakeBlockTransfer(p.src_info.region_id(), s, p.dst_info.region_id(), t);
  spec.set_num_tokens(uint64_t{blocks} * 16);
  spec.mutable_src()->set_grant(p.src_grant);
  spec.mutable_dst()->set_grant(p.dst_grant);
  return spec;
}

// One transfer of `blocks` blocks through kvraild; returns seconds (submit to completion).
double Through(Daemon& d, const Pools& p, uint32_t blocks, std::string* engine, std::string* path) {
  const v1::TransferSpec spec = SpecFor(p, blocks);
  const auto t0 = Clock::now();
  const double u0 = UnixUs();
  auto sub = Must(d.client->Submit(spec), "submit");
  const double u1 = UnixUs();
  auto st = Must(d.client->Wait(sub.transfer_id()), "wait");
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  const double u2 = UnixUs();
  last_phases.submit_ms = (u1 - u0) / 1e3;
  last_phases.queued_ms = (st.started_unix_us() - st.submitted_unix_us()) / 1e3;
  last_phases.running_ms = (st.finished_unix_us() - st.started_unix_us()) / 1e3;
  last_phases.notify_ms = (u2 - st.finished_unix_us()) / 1e3;
  last_phases.to_daemon_ms = (st.received_unix_us() - u0) / 1e3;
  last_phases.accept_ms = (st.submitted_unix_us() - st.received_unix_us()) / 1e3;
  last_phases.reply_ms = (u1 - st.submitted_unix_us()) / 1e3;
  if (st.state() != v1::TRANSFER_STATE_SUCCEEDED) {
    std::fprintf(stderr, "transfer failed: %s\n", st.error_message().c_str());
    std::exit(1);
  }
  if (engine) *engine = st.engine();
  if (path) *path = v1::Path_Name(st.path());
  return sec;
}

// GB/s of `reps` transfers (after one warm-up): median, min, max.
Spread ThroughSpread(Daemon& d, const Pools& p, int reps, std::string* engine, std::string* path) {
  Through(d, p, p.moved, engine, path);
  std::vector<double> gbps;
  for (int i = 0; i < reps; ++i) {
    gbps.push_back(
        Gbps(uint64_t{p.moved} * p.block_bytes, Through(d, p, p.moved, nullptr, nullptr)));
  }
  return SpreadOf(gbps);
}

// Sustained rate: `count` transfers of the pools' blocks with two in flight (the next is
// submitted while the previous runs, as a prefill server hands over request after request), in
// GB/s from the first submit to the last completion. The same destination blocks each time (the
// same bytes land there); the per-transfer submit and completion then overlap other work.
double Pipelined(Daemon& d, const Pools& p, int count) {
  const v1::TransferSpec spec = SpecFor(p, p.moved);
  const auto t0 = Clock::now();
  std::deque<uint64_t> ids;
  for (int i = 0; i < count; ++i) {
    ids.push_back(Must(d.client->Submit(spec), "submit").transfer_id());
    if (ids.size() == 2) {
      const auto st = Must(d.client->Wait(ids.front()), "wait");
      if (st.state() != v1::TRANSFER_STATE_SUCCEEDED) std::exit(1);
      ids.pop_front();
    }
  }
  for (uint64_t id : ids) {
    if (Must(d.client->Wait(id), "wait").state() != v1::TRANSFER_STATE_SUCCEEDED) std::exit(1);
  }
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  return Gbps(uint64_t{p.moved} * p.block_bytes * count, sec);
}

// GB/s of `bytes` moved by `body` on a stream of the current device, each of `reps` runs timed
// with events (after one warm-up): median, min, max.
Spread TimeStream(const std::function<void(cudaStream_t)>& body, int reps, uint64_t bytes) {
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  body(s);
  Check(cudaStreamSynchronize(s), "warm-up");
  std::vector<double> gbps;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    body(s);
    cudaEventRecord(b, s);
    Check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    gbps.push_back(Gbps(bytes, ms / 1e3));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return SpreadOf(gbps);
}

// A Python helper in its own process, stdin and stdout piped (the GEMM load, the NCCL baseline).
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) {
      std::perror("pipe");
      std::exit(1);
    }
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[0]), close(in[1]), close(out[0]), close(out[1]);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  ~Child() {
    if (to_) fclose(to_);
    if (from_) fclose(from_);
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Next line of output without the newline; empty at end of file.
  std::string Line() {
    char buf[512];
    if (std::fgets(buf, sizeof buf, from_) == nullptr) return "";
    std::string l(buf);
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
    return l;
  }
  void Say(const std::string& line) {
    std::fprintf(to_, "%s\n", line.c_str());
    std::fflush(to_);
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

std::string Python() {
  const char* p = std::getenv("PYTHON");
  return p ? p : "python3";
}

// NCCL pack + send/recv + unpack GB/s per block KiB, from tests/gpu/nccl_baseline.py.
std::map<uint64_t, double> NcclBaseline(uint64_t total, int reps) {
  std::map<uint64_t, double> out;
  Child c({"timeout", "180", Python(), "tests/gpu/nccl_baseline.py", "--total-bytes",
           std::to_string(total), "--reps", std::to_string(reps)});
  for (std::string l = c.Line(); !l.empty(); l = c.Line()) {
    unsigned long kib = 0;
    double g = 0;
    if (std::sscanf(l.c_str(), "nccl %lu %lf", &kib, &g) == 2) out[kib] = g;
  }
  return out;
}

// Transfers every destination block's bytes back and checks them against the source's: the
// benchmark's transfers moved the right blocks (a bench that times a wrong copy is worthless).
void VerifyBlocks(const Pools& p) {
  std::vector<uint8_t> a(p.block_bytes), b(p.block_bytes);
  for (uint32_t i = 0; i < p.moved; i += std::max<uint32_t>(1, p.moved / 512)) {
    Check(cudaMemcpy(a.data(), p.src->data() + uint64_t{p.src_blocks[i]} * p.block_bytes,
                     p.block_bytes, cudaMemcpyDefault),
          "verify src");
    const uint8_t* d = p.dst ? p.dst->data() : p.host_dst->data();
    Check(cudaMemcpy(b.data(), d + uint64_t{p.dst_blocks[i]} * p.block_bytes, p.block_bytes,
                     cudaMemcpyDefault),
          "verify dst");
    if (a != b) {
      std::fprintf(stderr, "block %u arrived wrong\n", i);
      std::exit(1);
    }
  }
}

// Fills the whole source pool with words that differ everywhere (a misplaced or unwritten block
// shows) and zeroes the destination.
void Pattern(const Pools& p) {
  const uint64_t bytes = uint64_t{p.pool_blocks} * p.block_bytes;
  std::vector<uint32_t> words((64ull << 20) / 4);
  for (uint64_t at = 0; at < bytes; at += words.size() * 4) {
    const uint64_t n = std::min<uint64_t>(words.size() * 4, bytes - at);
    for (uint64_t w = 0; w < n / 4; ++w)
      words[w] = static_cast<uint32_t>((at / 4 + w + 1) * 2654435761u);
    Check(cudaMemcpy(p.src->data() + at, words.data(), n, cudaMemcpyHostToDevice), "pattern");
  }
  if (p.dst && !p.dst->Fill(0).ok()) std::exit(1);
  Check(cudaDeviceSynchronize(), "sync");
  Check(cudaSetDevice(g_src), "cudaSetDevice(--src-gpu)");
}

// One run of tests/gpu/gemm_load.py (an 8192^3 bf16 GEMM loop) on the source GPU for `seconds`,
// its SM share limited to `limit` percent under MPS unless empty, with back-to-back transfers of
// `p` through `d` beside it when `d` is set (their GB/s into *transfer_gbps). Returns the GEMM's
// TFLOP/s; *clocks: the GPU's mean SM clock, power and capped share during it ("" without NVML).
double GemmRun(Daemon* d, const Pools* p, double* transfer_gbps, const std::string& limit,
               double seconds, std::string* clocks) {
  std::vector<std::string> args = {Python(),    "tests/gpu/gemm_load.py",
                                   "--device",  std::to_string(g_src),
                                   "--seconds", std::to_string(seconds)};
  if (!limit.empty()) {
    args.insert(args.begin(), {"env", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + limit});
  }
  Child g(args);
  if (g.Line() != "ready") {
    std::fprintf(stderr, "gemm_load.py did not start\n");
    std::exit(1);
  }
  g.Say("go");
  if (d != nullptr) {
    uint64_t bytes = 0;
    const auto t0 = Clock::now();
    double sec = 0;
    while (sec < seconds) {
      Through(*d, *p, p->moved, nullptr, nullptr);
      bytes += uint64_t{p->moved} * p->block_bytes;
      sec = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    *transfer_gbps = Gbps(bytes, sec);
  }
  double tflops = 0;
  *clocks = "";
  for (std::string l = g.Line(); !l.empty(); l = g.Line()) {
    std::sscanf(l.c_str(), "tflops %lf", &tflops);
    double mhz = 0, watts = 0, capped = 0;
    if (std::sscanf(l.c_str(), "gpu sm_mhz %lf power_w %lf capped %lf", &mhz, &watts, &capped) ==
        3) {
      *clocks = absl::StrFormat("%.0f MHz, %.0f W, capped %.0f%%", mhz, watts, 100 * capped);
    }
  }
  return tflops;
}

// `only_limit` non-empty: the pull rows (two GPUs) and, at just that GEMM SM limit, copy engines
// and 4-8 fixed CTAs (a finer sweep).
int Interference(int dst_device, bool quick, const std::string& only_limit) {
  const double seconds = quick ? 2.0 : 4.0;
  // `limit`: the GEMM's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE ("" = all SMs), leaving SMs to kvraild.
  // `clocks`: the source GPU's mean SM clock, power and how often a power/thermal cap held it
  // during the last GEMM run (gemm_load.py reads NVML), or "" where NVML does not answer.
  std::string clocks;
  const auto gemm = [&](Daemon* d, const Pools* p, double* transfer_gbps,
                        const std::string& limit) {
    return GemmRun(d, p, transfer_gbps, limit, seconds, &clocks);
  };
  std::printf(
      "## Interference: 8192^3 bf16 GEMM loop in another process on GPU%d, transfers "
      "GPU%d -> GPU%d (16 KiB blocks, 256 MiB per transfer, back to back), %.0f s each\n",
      g_src, g_src, dst_device, seconds);
  const double alone = gemm(nullptr, nullptr, nullptr, "");
  const std::string alone_clocks = clocks;
  std::string limited = "";
  for (const char* l : {"90", "95", "96"}) {
    const double tf = gemm(nullptr, nullptr, nullptr, l);
    absl::StrAppend(&limited, limited.empty() ? "" : "; ", l, "%: ", absl::StrFormat("%.1f", tf),
                    clocks.empty() ? "" : absl::StrCat(" (", clocks, ")"));
  }
  std::printf(
      "GEMM alone: %.1f TFLOP/s (%s); alone limited to a share of SMs "
      "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): %s TFLOP/s\n\n",
      alone, alone_clocks.empty() ? "no NVML" : alone_clocks.c_str(), limited.c_str());
  std::printf(
      "| daemon setting | GEMM's SM limit | transfer GB/s beside GEMM | GEMM TFLOP/s | "
      "GEMM kept (vs unlimited alone) | source GPU during the GEMM | engine |\n"
      "|---|---|---|---|---|---|---|\n");
  struct Setting {
    std::string label, limit;
    std::vector<std::string> args;
  };
  std::vector<Setting> settings = {{"copy engines only (budget 0)", "", {"--cuda-max-ctas", "0"}}};
  for (int c : {2, 4, 8, 16, 32}) {
    settings.push_back({absl::StrCat(c, " CTAs fixed"),
                        "",
                        {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c)}});
  }
  settings.push_back({"adaptive, budget 16", "", {"--cuda-max-ctas", "16"}});
  settings.push_back({"adaptive, budget 132", "", {"--cuda-max-ctas", "132"}});
  for (int c : {8, 16}) {
    settings.push_back({absl::StrCat(c, " CTAs fixed"),
                        "90",
                        {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c)}});
  }
  settings.push_back({"adaptive, budget 16", "90", {"--cuda-max-ctas", "16"}});
  // A 95% limit leaves ~7 SMs: the kernel's warp path moves ~190-240 GB/s with 8 CTAs alone.
  for (int c : {4, 8}) {
    settings.push_back({absl::StrCat(c, " CTAs fixed"),
                        "95",
                        {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c)}});
  }
  settings.push_back({"adaptive, budget 8", "95", {"--cuda-max-ctas", "8"}});
  for (int c : {6, 8}) {
    settings.push_back({absl::StrCat(c, " CTAs fixed"),
                        "96",
                        {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c)}});
  }
  if (dst_device != g_src) {
    // Pull: kvraild's kernel runs on the destination GPU, loading from the source beside the
    // GEMM; the source lends no SMs, only HBM reads and NVLink.
    for (int c : {8, 16, 32}) {
      settings.push_back({absl::StrCat(c, " CTAs fixed, on the destination GPU"),
                          "",
                          {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c),
                           "--cuda-run-on", "destination"}});
    }
    settings.push_back({"adaptive, budget 132, on the destination GPU",
                        "",
                        {"--cuda-max-ctas", "132", "--cuda-run-on", "destination"}});
  }
  if (!only_limit.empty()) {
    // Only the pull rows (when there are two GPUs) and a sweep at the given limit.
    std::vector<Setting> pull;
    for (const Setting& s : settings) {
      if (s.label.find("destination") != std::string::npos) pull.push_back(s);
    }
    settings = pull;
    settings.push_back({"copy engines only (budget 0)", only_limit, {"--cuda-max-ctas", "0"}});
    for (int c : {4, 6, 7, 8}) {
      settings.push_back({absl::StrCat(c, " CTAs fixed"),
                          only_limit,
                          {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c)}});
    }
  }
  for (const auto& [label, limit, args] : settings) {
    Daemon d(args);
    Pools p = MakePools(d, 16 << 10, 256ull << 20, false, dst_device);
    for (int i = 0; i < 12; ++i) Through(d, p, p.moved, nullptr, nullptr);
    std::string engine;
    Through(d, p, p.moved, &engine, nullptr);
    double g = 0;
    const double tf = gemm(&d, &p, &g, limit);
    std::printf("| %s | %s | %.1f | %.1f | %.1f%% | %s | %s |\n", label.c_str(),
                limit.empty() ? "none" : (limit + "%").c_str(), g, tf, 100 * tf / alone,
                clocks.empty() ? "-" : clocks.c_str(), engine.c_str());
    std::fflush(stdout);
    Release(d, p);
  }
  return 0;
}

// The GEMM alone and beside back-to-back transfers (16 KiB blocks, 256 MiB each) through a
// kvraild at its shipped defaults, alternating, `pairs` times, `seconds` each: the cost to the
// GEMM with the run-to-run noise beside it (run under MPS, as deployed).
int GemmPairs(int dst_device, int pairs, double seconds) {
  std::printf(
      "## GEMM alone vs beside transfers, alternating: 8192^3 bf16 GEMM in another process "
      "on GPU%d, transfers GPU%d -> GPU%d through kvraild at its shipped defaults (16 KiB "
      "blocks, 256 MiB each, back to back), %.0f s per run, %d pairs; target: the GEMM "
      "keeps >= 97%% beside >= 250 GB/s\n\n",
      g_src, g_src, dst_device, seconds, pairs);
  Daemon d({});
  Pools p = MakePools(d, 16 << 10, 256ull << 20, false, dst_device);
  for (int i = 0; i < 12; ++i) Through(d, p, p.moved, nullptr, nullptr);
  std::string engine, clocks;
  Through(d, p, p.moved, &engine, nullptr);
  std::printf(
      "| pair | GEMM alone TFLOP/s | GEMM beside TFLOP/s | kept | transfer GB/s | source "
      "GPU during the GEMM beside |\n|---|---|---|---|---|---|\n");
  std::vector<double> alone, beside, kept, rate;
  for (int i = 0; i < pairs; ++i) {
    alone.push_back(GemmRun(nullptr, nullptr, nullptr, "", seconds, &clocks));
    double g = 0;
    beside.push_back(GemmRun(&d, &p, &g, "", seconds, &clocks));
    rate.push_back(g);
    kept.push_back(100 * beside.back() / alone.back());
    std::printf("| %d | %.1f | %.1f | %.1f%% | %.1f | %s |\n", i + 1, alone.back(), beside.back(),
                kept.back(), g, clocks.empty() ? "-" : clocks.c_str());
    std::fflush(stdout);
  }
  const Spread k = SpreadOf(kept), r = SpreadOf(rate);
  std::printf(
      "GEMM alone %s TFLOP/s, beside %s TFLOP/s; kept %s%% (median of the pairs' ratios, "
      "min-max); transfers %s GB/s; engine %s -> %s\n",
      Cell(SpreadOf(alone)).c_str(), Cell(SpreadOf(beside)).c_str(), Cell(k).c_str(),
      Cell(r).c_str(), engine.c_str(),
      k.median >= 97 && r.median >= 250 ? "target met" : "target MISSED");
  std::printf("engine: %s\n", d.Engines().c_str());
  Release(d, p);
  return 0;
}

int Main(int argc, char** argv) {
  const gpu_bench::GpuPair pair = gpu_bench::TakeGpuPair(&argc, argv);
  g_src = pair.src;
  bool quick = false, same_gpu = false, interference = false;
  int gemm_pairs = 0;
  std::string only_limit, tables = "1,1c,1b,2,3,4";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a == "--same-gpu")
      same_gpu = true;
    else if (a == "--interference")
      interference = true;
    else if (a.rfind("--interference-limit=", 0) == 0) {
      interference = true;
      only_limit = a.substr(21);
    } else if (a == "--gemm-pairs" && i + 1 < argc) {
      gemm_pairs = std::atoi(argv[++i]);
      if (gemm_pairs <= 0) {
        std::fprintf(stderr, "--gemm-pairs: expected a positive count\n");
        return 2;
      }
    } else if (a == "--tables" && i + 1 < argc) {
      tables = argv[++i];
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const auto want = [&tables](const char* t) {
    return absl::StrCat(",", tables, ",").find(absl::StrCat(",", t, ",")) != std::string::npos;
  };
  const uint64_t total = quick ? (256ull << 20) : (1ull << 30);
  const int reps = quick ? 3 : 7;
  const int devices = client::CudaDeviceCount();
  const int dst_device = same_gpu ? pair.src : pair.dst;
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, pair.src), "props");
  const std::string where = absl::StrFormat("GPU%d -> GPU%d", pair.src, dst_device);
  std::printf("device: %d x %s, %d SMs; %s; %.0f MiB of scattered blocks per transfer\n", devices,
              prop.name, prop.multiProcessorCount, where.c_str(), total / 1048576.0);
  if (interference) return Interference(dst_device, quick, only_limit);
  if (gemm_pairs > 0) return GemmPairs(dst_device, gemm_pairs, quick ? 2.0 : 3.0);

  std::map<uint64_t, double> nccl;
  if (dst_device != pair.src && want("1")) {
    nccl = NcclBaseline(total, quick ? 2 : 3);
    if (nccl.empty()) std::printf("(NCCL baseline: tests/gpu/nccl_baseline.py gave no result)\n");
  }
  // Table 1 at the shipped defaults (the headline), then tuned (the whole GPU, 132 CTAs).
  struct Config {
    const char* label;
    std::vector<std::string> args;
  };
  const std::vector<Config> table1 = {{"shipped defaults", {}},
                                      {"tuned: 132 CTAs", {"--cuda-max-ctas", "132"}}};
  for (const Config& config : want("1") ? table1 : std::vector<Config>{}) {
    std::printf(
        "\n## 1. %s, %s, GB/s median (min-max) of %d; target >= 350 and >= 88%% of the "
        "ceiling (>= 95%% at 32-128 KiB), >= 1.8x NCCL\n",
        where.c_str(), config.label, reps);
    std::printf(
        "| setting | block | kvraild e2e | e2e, gRPC only | engine (path) | per-block "
        "cudaMemcpyAsync | cudaMemcpyBatchAsync | NCCL pack+send/recv+unpack | contiguous "
        "ceiling (copy engine) | e2e / ceiling (medians) | e2e / NCCL | sustained, 2 in "
        "flight |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    Daemon d(config.args);
    std::vector<std::string> phase_rows;
    for (uint64_t kib : {4, 16, 32, 128}) {
      Pools p = MakePools(d, kib << 10, total, false, dst_device);
      Pattern(p);
      std::string engine, path;
      std::unique_ptr<client::Client> grpc_only = GrpcOnlyClient(d);
      std::swap(d.client, grpc_only);
      const Spread e2e_grpc = ThroughSpread(d, p, reps, nullptr, nullptr);
      std::swap(d.client, grpc_only);
      const Spread e2e = ThroughSpread(d, p, reps, &engine, &path);
      // The engine's own account of the last e2e job: its set-up (plan upload enqueued) and its
      // batches (read before the sustained run replaces it).
      const std::string setup = EngineField(d, "last job set-up ", ";");
      const std::string busy = LastJobBusy(d);
      const double sustained = Pipelined(d, p, quick ? 4 : 8);
      VerifyBlocks(p);
      std::vector<void*> dsts(p.moved);
      std::vector<const void*> srcs(p.moved);
      std::vector<size_t> sizes(p.moved, p.block_bytes);
      for (uint32_t i = 0; i < p.moved; ++i) {
        dsts[i] = p.dst->data() + uint64_t{p.dst_blocks[i]} * p.block_bytes;
        srcs[i] = p.src->data() + uint64_t{p.src_blocks[i]} * p.block_bytes;
      }
      const uint64_t bytes = uint64_t{p.moved} * p.block_bytes;
      const Spread per_block = TimeStream(
          [&](cudaStream_t s) {
            for (uint32_t i = 0; i < p.moved; ++i) {
              cudaMemcpyAsync(dsts[i], srcs[i], p.block_bytes, cudaMemcpyDefault, s);
            }
          },
          quick ? 1 : 3, bytes);
      cudaError_t batch_error = cudaSuccess;
      const Spread batch = TimeStream(
          [&](cudaStream_t s) {
            cudaMemcpyAttributes attrs{};
            attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            size_t idx = 0;
            const cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                                       p.moved, &attrs, &idx, 1, s);
            if (e != cudaSuccess) batch_error = e, cudaGetLastError();
          },
          reps, bytes);
      if (batch_error != cudaSuccess) {
        std::printf("(cudaMemcpyBatchAsync failed: %s)\n", cudaGetErrorString(batch_error));
      }
      const Spread contiguous = TimeStream(
          [&](cudaStream_t s) {
            cudaMemcpyPeerAsync(p.dst->data(), dst_device, p.src->data(), g_src, bytes, s);
          },
          reps, bytes);
      const auto n = nccl.find(kib);
      const std::string nccl_cell = n == nccl.end() ? "n/a" : absl::StrFormat("%.1f", n->second);
      const std::string nccl_ratio =
          n == nccl.end() ? "n/a" : absl::StrFormat("%.2fx", e2e.median / n->second);
      phase_rows.push_back(absl::StrFormat(
          "| %lu KiB | %u | %.2f (%.2f + %.2f + %.2f) | %.2f | %.2f | %.2f | %s | %s |", kib,
          p.moved, last_phases.submit_ms, last_phases.to_daemon_ms, last_phases.accept_ms,
          last_phases.reply_ms, last_phases.queued_ms, last_phases.running_ms,
          last_phases.notify_ms, setup.c_str(), busy.c_str()));
      std::printf("| %s | %lu KiB | %s | %s | %s (%s) | %s | %s | %s | %s | %.1f%% | %s | %.1f |\n",
                  config.label, kib, Cell(e2e).c_str(), Cell(e2e_grpc).c_str(), engine.c_str(),
                  path.c_str(), Cell(per_block).c_str(), Cell(batch).c_str(), nccl_cell.c_str(),
                  Cell(contiguous).c_str(), 100 * e2e.median / contiguous.median,
                  nccl_ratio.c_str(), sustained);
      std::fflush(stdout);
      Release(d, p);
    }
    std::printf("engines after table 1 (%s): %s\n", config.label, d.Engines().c_str());
    std::printf(
        "\nwhere the time of the last e2e transfer went (ms; submit = the Submit RPC, "
        "split as client -> daemon + accept work + reply; queued = accepted -> first tile, "
        "running = first tile -> last, notify = last tile -> client):\n"
        "| block | blocks | submit | queued | running | notify | engine's job set-up | "
        "engine: the job's batches (GPU busy of first launch -> last completion) |\n"
        "|---|---|---|---|---|---|---|---|\n");
    for (const auto& row : phase_rows) std::printf("%s\n", row.c_str());
  }

  if (want("1c")) {
    // The same transfers with the knee finder off (every batch at 132 CTAs, the whole GPU),
    // with larger batches, and with the block tables already in registered memory (a server
    // that keeps them there names them with BlockTableRef; no ids are copied by the client).
    // What the daemon moves when an operator gives it all SMs; the default keeps the knee.
    std::printf(
        "\n## 1c. %s, tuned kvraild settings for bandwidth, 1 GiB, GB/s median (min-max) of %d\n"
        "| setting | block | e2e GB/s | e2e / NCCL | sustained, 2 in flight | submit (to "
        "daemon + accept + reply) | queued | running | notify | engine: the job's batches |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n",
        where.c_str(), reps);
    struct Setting {
      const char* label;
      std::vector<std::string> args;
      bool refs;
    };
    const std::vector<Setting> settings = {
        {"132 CTAs, 64 MiB batches", {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", "132"}, false},
        {"132 CTAs, 256 MiB batches",
         {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", "132", "--cuda-batch-bytes", "268435456"},
         false},
        {"132 CTAs, 256 MiB batches, BlockTableRef",
         {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", "132", "--cuda-batch-bytes", "268435456"},
         true},
    };
    for (const Setting& setting : settings) {
      Daemon full(setting.args);
      for (uint64_t kib : {4, 16, 32, 128}) {
        Pools p = MakePools(full, kib << 10, total, false, dst_device);
        if (setting.refs) UseTableRefs(full, p);
        Pattern(p);
        const Spread e2e = ThroughSpread(full, p, reps, nullptr, nullptr);
        const Phases phases = last_phases;
        const std::string batches = LastJobBusy(full);
        const double sustained = Pipelined(full, p, quick ? 4 : 8);
        VerifyBlocks(p);
        const auto n = nccl.find(kib);
        std::printf(
            "| tuned: %s | %lu KiB | %s | %s | %.1f | %.2f (%.2f + %.2f + %.2f) | %.2f | %.2f | "
            "%.2f | %s |\n",
            setting.label, kib, Cell(e2e).c_str(),
            n == nccl.end() ? "n/a" : absl::StrFormat("%.2fx", e2e.median / n->second).c_str(),
            sustained, phases.submit_ms, phases.to_daemon_ms, phases.accept_ms, phases.reply_ms,
            phases.queued_ms, phases.running_ms, phases.notify_ms, batches.c_str());
        std::fflush(stdout);
        Release(full, p);
      }
    }
  }

  if (want("1b")) {
    Daemon d({});
    std::printf(
        "\n## 1b. Llama-3-70B TP8-like layout (80 layers, K+V, 1 KV head, head_dim 128, bf16,"
        " 16-token blocks: 4 KiB runs), %s, shipped defaults; target >= 300 GB/s\n",
        where.c_str());
    {
      const uint32_t moved = static_cast<uint32_t>(total / (80 * 2 * 4096));
      const v1::PagedKvLayout l70 = testing::MakeLayout(
          80, 2, 2 * moved, 16, 1, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
      Pools p = MakePoolsWith(d, l70, moved, false, dst_device);
      std::string engine, path;
      const Spread g = ThroughSpread(d, p, reps, &engine, &path);
      std::printf("%u blocks x 80 layers x 2 = %.0f MiB: %s GB/s, %s (%s)\n", moved,
                  moved * 640.0 / 1024, Cell(g).c_str(), engine.c_str(), path.c_str());
      Release(d, p);
    }
  }

  if (want("2")) {
    Daemon d({});
    std::printf(
        "\n## 2. 16 MiB transfer (16 KiB blocks), %s, shipped defaults, submit -> completion seen "
        "by the client\n",
        where.c_str());
    Pools p = MakePools(d, 16 << 10, 64ull << 20, false, dst_device);
    const double target = 100e-6 + (16 << 20) / 350e9;
    // 50 transfers after 10 warm-ups with the daemon's client as it is, then printed.
    const auto measure = [&](const char* how) {
      std::vector<double> lat;
      std::vector<Phases> phases;
      for (int i = 0; i < 60; ++i) {
        lat.push_back(Through(d, p, 1024, nullptr, nullptr));
        phases.push_back(last_phases);
      }
      lat.erase(lat.begin(), lat.begin() + 10);
      phases.erase(phases.begin(), phases.begin() + 10);
      std::sort(lat.begin(), lat.end());
      const auto median = [&](double Phases::*field) {
        std::vector<double> v;
        for (const Phases& ph : phases) v.push_back(ph.*field);
        std::sort(v.begin(), v.end());
        return v[v.size() / 2] * 1e3;
      };
      std::printf("%s: p50 %.1f us, p90 %.1f us, min %.1f us, max %.1f us (target p50 < %.1f us)\n",
                  how, lat[lat.size() / 2] * 1e6, lat[lat.size() * 9 / 10] * 1e6, lat[0] * 1e6,
                  lat.back() * 1e6, target * 1e6);
      std::printf(
          "  phase medians (us): client -> daemon %.1f, accept %.1f, reply %.1f, queued "
          "%.1f, running %.1f, notify %.1f\n",
          median(&Phases::to_daemon_ms), median(&Phases::accept_ms), median(&Phases::reply_ms),
          median(&Phases::queued_ms), median(&Phases::running_ms), median(&Phases::notify_ms));
    };
    {
      // Before the session socket carried submits: both calls over gRPC.
      std::unique_ptr<client::Client> grpc_only = GrpcOnlyClient(d);
      std::swap(d.client, grpc_only);
      measure("SubmitTransfer (gRPC) + WaitTransfer");
      std::swap(d.client, grpc_only);
    }
    measure("the client library (SUBMIT and WAIT on the session socket)");
    // The same transfers, completion seen through the arrival flag (the daemon writes the word in
    // shared memory when the layer -- here the whole transfer -- has landed) instead of the
    // WaitTransfer RPC; the status is read afterwards to check it succeeded.
    {
      auto flag_buffer = Must(d.client->CreateHostBuffer(4096), "flag buffer");
      v1::RegionSpec flag_spec;
      flag_spec.set_name("arrival flags");
      flag_spec.set_writable(true);
      const v1::RegionInfo flags =
          Must(d.client->RegisterHostBuffer(*flag_buffer, flag_spec), "register flags");
      auto* word = reinterpret_cast<volatile uint32_t*>(flag_buffer->data());
      std::vector<double> by_flag;
      for (uint32_t i = 0; i < 60; ++i) {
        std::vector<uint32_t> sb(p.src_blocks.begin(), p.src_blocks.begin() + 1024);
        std::vector<uint32_t> db(p.dst_blocks.begin(), p.dst_blocks.begin() + 1024);
        v1::TransferSpec spec =
            client::MakeBlockTransfer(p.src_info.region_id(), sb, p.dst_info.region_id(), db);
        spec.set_num_tokens(1024 * 16);
        spec.mutable_arrival_flags()->set_region_id(flags.region_id());
        spec.mutable_arrival_flags()->set_byte_offset(0);
        spec.mutable_arrival_flags()->set_value(i + 1);
        const auto t0 = Clock::now();
        auto sub = Must(d.client->Submit(spec), "submit");
        while (*word != i + 1) {
          if (Clock::now() - t0 > std::chrono::seconds(10)) {
            std::fprintf(stderr, "arrival flag never came\n");
            std::exit(1);
          }
        }
        const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        auto st = Must(d.client->Wait(sub.transfer_id()), "wait");
        if (st.state() != v1::TRANSFER_STATE_SUCCEEDED) {
          std::fprintf(stderr, "transfer failed: %s\n", st.error_message().c_str());
          std::exit(1);
        }
        if (i >= 10) by_flag.push_back(sec);
      }
      std::sort(by_flag.begin(), by_flag.end());
      std::printf(
          "SUBMIT on the session socket + the arrival flag instead of a wait: p50 %.1f us, "
          "p90 %.1f us, min %.1f us, max %.1f us\n",
          by_flag[by_flag.size() / 2] * 1e6, by_flag[by_flag.size() * 9 / 10] * 1e6,
          by_flag[0] * 1e6, by_flag.back() * 1e6);
      (void)d.client->UnregisterRegion(flags.region_id());
    }
    Release(d, p);
  }

  if (want("3")) {
    std::printf(
        "\n## 3. SM budget sweep, %s, 4 KiB and 16 KiB blocks, 1 GiB per transfer, GB/s "
        "through kvraild, median (min-max) of %d; target >= 320 with at most 16 CTAs\n",
        where.c_str(), reps);
    std::printf(
        "| daemon setting | 4 KiB | 16 KiB | 16 KiB sustained, 2 in flight | engine |\n"
        "|---|---|---|---|---|\n");
    std::vector<std::pair<std::string, std::vector<std::string>>> settings = {
        {"shipped defaults (adaptive, budget 32)", {}},
        {"copy engines only (budget 0)", {"--cuda-max-ctas", "0"}}};
    for (int c : {2, 4, 8, 16, 32, 64, 132}) {
      settings.push_back({absl::StrCat(c, " CTAs fixed"),
                          {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c)}});
    }
    for (int c : {8, 16}) {
      settings.push_back({absl::StrCat(c, " CTAs fixed, 256 MiB batches"),
                          {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c),
                           "--cuda-batch-bytes", "268435456"}});
    }
    settings.push_back({"adaptive, budget 16", {"--cuda-max-ctas", "16"}});
    settings.push_back({"tuned: adaptive, budget 132", {"--cuda-max-ctas", "132"}});
    if (dst_device != pair.src) {
      // Pull: the destination GPU's SMs load from the source GPU.
      for (int c : {8, 16}) {
        settings.push_back({absl::StrCat(c, " CTAs fixed, on the destination GPU"),
                            {"--cuda-max-ctas", "132", "--cuda-fixed-ctas", std::to_string(c),
                             "--cuda-run-on", "destination"}});
      }
      settings.push_back({"tuned: adaptive, budget 132, on the destination GPU",
                          {"--cuda-max-ctas", "132", "--cuda-run-on", "destination"}});
    }
    for (const auto& [label, args] : settings) {
      Daemon d(args);
      Spread g[2];
      double sustained = 0;
      std::string engine;
      int k = 0;
      const bool adaptive = label.find("adaptive") != std::string::npos;
      for (uint64_t kib : {4, 16}) {
        Pools p = MakePools(d, kib << 10, total, false, dst_device);
        // Adaptive daemons need a few batches to probe: run more before measuring.
        if (adaptive) {
          for (int i = 0; i < 12; ++i) Through(d, p, p.moved, nullptr, nullptr);
        }
        g[k++] = ThroughSpread(d, p, reps, &engine, nullptr);
        if (kib == 16) sustained = Pipelined(d, p, quick ? 4 : 8);
        Release(d, p);
      }
      std::printf("| %s | %s | %s | %.1f | %s |\n", label.c_str(), Cell(g[0]).c_str(),
                  Cell(g[1]).c_str(), sustained, engine.c_str());
      if (adaptive) std::printf("  stats: %s\n", d.Engines().c_str());
      std::fflush(stdout);
    }
  }

  if (want("4")) {
    std::printf(
        "\n## 4. GPU%d -> pinned host memory through kvraild at its shipped defaults (32 "
        "KiB blocks), GB/s median (min-max) of %d\n",
        pair.src, reps);
    Daemon d({});
    Pools p = MakePools(d, 32 << 10, total / 2, true, pair.src);
    std::string engine, path;
    const Spread g = ThroughSpread(d, p, reps, &engine, &path);
    std::printf("%s GB/s, %s, %s\n", Cell(g).c_str(), engine.c_str(), path.c_str());
    Release(d, p);
  }
  return 0;
}

}  // namespace
}  // namespace kvrail

int main(int argc, char** argv) { return kvrail::Main(argc, argv); }
