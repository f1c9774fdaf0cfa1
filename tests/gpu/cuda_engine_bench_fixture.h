// The shared fixture of cuda_engine_bench (its tables are in cuda_engine_bench*.cc): a kvraild
// per setting, source and destination pools of scattered blocks, transfers through the daemon
// timed with their phases, copies timed on a stream, and the Python helpers' processes.
#pragma once

#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "tests/gpu/bench_check.h"
#include "tests/gpu/bench_daemon.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::engine_bench {

using Clock = std::chrono::steady_clock;

using gpu_bench::Check;

using gpu_bench::Cell;
using gpu_bench::Must;
using gpu_bench::Spread;
using gpu_bench::SpreadOf;

// The source GPU (--src-gpu): source pools, the GEMM load, this process's streams.
extern int g_src;

// What every table is given: the run's size and repetitions, its GPUs and how the header names
// them ("GPU0 -> GPU1").
struct Run {
  bool quick = false;
  uint64_t total = 0;  // bytes of scattered blocks per transfer
  int reps = 0;
  int src = 0;
  int dst_device = 0;
  std::string where;
};

// A pool of `blocks` blocks of `block_bytes`: 1 layer, 1 part, 16 tokens, 1 head, bf16.
v1::PagedKvLayout BlockLayout(uint32_t blocks, uint64_t block_bytes);

std::vector<uint32_t> Scattered(uint32_t pool, uint32_t n, uint64_t seed);

double Gbps(uint64_t bytes, double seconds);

// A kvraild started with `args` (gpu_bench::BenchDaemon).
struct Daemon : gpu_bench::BenchDaemon {
  explicit Daemon(const std::vector<std::string>& args) : BenchDaemon("", args) {}
};

// The text after `key` in the first GPU's line of GetStats' engines, up to `end` (exclusive) or
// the next engine; "?" when absent.
std::string EngineField(Daemon& d, const std::string& key, const std::string& end);

// The engine's account of the last job's batches ("N batches, GPU busy X of Y ms ...").
std::string LastJobBusy(Daemon& d);

// A client of `d` that submits over gRPC only (SubmitTransfer), as before the session socket
// carried submits; swap it into d.client for a measurement.
std::unique_ptr<client::Client> GrpcOnlyClient(Daemon& d);

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
                    int dst_device);
Pools MakePools(Daemon& d, uint64_t block_bytes, uint64_t total, bool dst_host, int dst_device);
void Release(Daemon& d, Pools& p);

// Writes both block tables into a registered host buffer once; later transfers reference them.
void UseTableRefs(Daemon& d, Pools& p);

// Where the time of the last Through() went, in ms: the Submit RPC (client side), accepted ->
// first tile started, started -> finished (daemon clock), finished -> the client saw it.
struct Phases {
  double submit_ms = 0, queued_ms = 0, running_ms = 0, notify_ms = 0;
  // The Submit RPC split: client -> the daemon's handler, the handler's accept work (validation,
  // planning, the record), and the handler's return -> the client holding the answer.
  double to_daemon_ms = 0, accept_ms = 0, reply_ms = 0;
};
extern Phases last_phases;

// The transfer of the first `blocks` entries of the pools' block tables.
v1::TransferSpec SpecFor(const Pools& p, uint32_t blocks);

// One transfer of `blocks` blocks through kvraild; returns seconds (submit to completion).
double Through(Daemon& d, const Pools& p, uint32_t blocks, std::string* engine, std::string* path);

// GB/s of `reps` transfers (after one warm-up): median, min, max.
Spread ThroughSpread(Daemon& d, const Pools& p, int reps, std::string* engine, std::string* path);

// Sustained rate: `count` transfers of the pools' blocks with two in flight (the next is
// submitted while the previous runs, as a prefill server hands over request after request), in
// GB/s from the first submit to the last completion. The same destination blocks each time (the
// same bytes land there); the per-transfer submit and completion then overlap other work.
double Pipelined(Daemon& d, const Pools& p, int count);

// GB/s of `bytes` moved by `body` on a stream of the current device, each of `reps` runs timed
// with events (after one warm-up): median, min, max.
Spread TimeStream(const std::function<void(cudaStream_t)>& body, int reps, uint64_t bytes);

// A Python helper in its own process, stdin and stdout piped (the GEMM load, the NCCL baseline).
class Child {
 public:
  explicit Child(const std::vector<std::string>& args);
  ~Child();
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

// $PYTHON, else python3.
std::string Python();

// NCCL pack + send/recv + unpack GB/s per block KiB, from tests/gpu/nccl_baseline.py.
std::map<uint64_t, double> NcclBaseline(uint64_t total, int reps);

// Transfers every destination block's bytes back and checks them against the source's: the
// benchmark's transfers moved the right blocks (a bench that times a wrong copy is worthless).
void VerifyBlocks(const Pools& p);

// Fills the whole source pool with words that differ everywhere (a misplaced or unwritten block
// shows) and zeroes the destination.
void Pattern(const Pools& p);

// The tables (cuda_engine_bench_scattered.cc, cuda_engine_bench_tables.cc): each prints its own.
// Table 1: scattered blocks end to end beside the per-block, batch, NCCL and ceiling copies, at
// the shipped defaults and tuned; `nccl` the NCCL baseline per block KiB (empty without).
void ScatteredTable(const Run& run, const std::map<uint64_t, double>& nccl);
// Table 1c: the same with tuned daemon settings for bandwidth.
void TunedTable(const Run& run, const std::map<uint64_t, double>& nccl);
// Table 1b: a Llama-3-70B TP8-like layout.
void LlamaTable(const Run& run);
// Table 2: submit -> completion latency of a 16 MiB transfer.
void LatencyTable(const Run& run);
// Table 3: the SM budget sweep.
void SmSweepTable(const Run& run);
// Table 4: the source GPU -> pinned host memory.
void HostTable(const Run& run);

// The GEMM runs (cuda_engine_bench_gemm.cc), each a whole run of the program.
int Interference(int dst_device, bool quick, const std::string& only_limit);
int GemmPairs(int dst_device, int pairs, double seconds);

}  // namespace kvrail::engine_bench
