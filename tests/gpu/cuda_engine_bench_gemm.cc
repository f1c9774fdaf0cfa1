// cuda_engine_bench's GEMM runs (--interference, --gemm-pairs): an 8192^3 bf16 GEMM loop in
// another process on the source GPU (tests/gpu/gemm_load.py) beside transfers through kvraild.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/gpu/cuda_engine_bench_fixture.h"

namespace kvrail::engine_bench {
namespace {

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

}  // namespace

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

}  // namespace kvrail::engine_bench
