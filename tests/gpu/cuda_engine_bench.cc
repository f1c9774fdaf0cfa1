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
// This file reads the flags and runs the tables: 1, 1c and 1b are in
// cuda_engine_bench_scattered.cc, 2, 3 and 4 in cuda_engine_bench_tables.cc, the GEMM runs in
// cuda_engine_bench_gemm.cc, and what they share in cuda_engine_bench_fixture.h.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cuda_export.h"
#include "tests/gpu/bench_check.h"
#include "tests/gpu/cuda_engine_bench_fixture.h"

namespace kvrail::engine_bench {
namespace {

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
  const Run run{quick, total, reps, pair.src, dst_device, where};
  if (want("1")) ScatteredTable(run, nccl);
  if (want("1c")) TunedTable(run, nccl);
  if (want("1b")) LlamaTable(run);
  if (want("2")) LatencyTable(run);
  if (want("3")) SmSweepTable(run);
  if (want("4")) HostTable(run);
  return 0;
}

}  // namespace
}  // namespace kvrail::engine_bench

int main(int argc, char** argv) { return kvrail::engine_bench::Main(argc, argv); }
