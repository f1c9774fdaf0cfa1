// cluster_sim: the cluster simulation as a benchmark (docs/benchmarks.md).
//   bazel run -c opt //tests/sim:cluster_sim -- [--fixture=dgx_h100] [--nodes=128]
//       [--prefill_nodes=32] [--prefill_tp=8] [--decode_tp=8] [--seconds=3600] [--rate=40]
//       [--median_tokens=1536] [--layers=80] [--tokens_per_s=12000] [--seed=1]
//       [--no_hierarchical] [--no_load] [--trace=FILE.csv] [--save_trace=FILE.csv]
// --fixture names topology/fixtures/<name>.textproto or is a path.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "tests/sim/cluster_sim.h"
#include "topology/topology.h"

int main(int argc, char** argv) {
  using namespace kvrail;
  std::string fixture = "dgx_h100", trace, save_trace;
  sim::SimConfig config;
  config.nodes = 128;
  config.prefill_nodes = 32;
  sim::WorkloadOptions work;
  work.seconds = 3600;
  work.rate_per_s = 40;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq),
                      value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = true;
    int n = 0;
    double d = 0;
    if (key == "--fixture")
      fixture = value;
    else if (key == "--trace")
      trace = value;
    else if (key == "--save_trace")
      save_trace = value;
    else if (key == "--no_hierarchical")
      config.routing.hierarchical = false;
    else if (key == "--no_load")
      config.load_aware = false;
    else if (key == "--nodes" && (ok = absl::SimpleAtoi(value, &n)))
      config.nodes = n;
    else if (key == "--prefill_nodes" && (ok = absl::SimpleAtoi(value, &n)))
      config.prefill_nodes = n;
    else if (key == "--prefill_tp" && (ok = absl::SimpleAtoi(value, &n)))
      config.prefill_tp = n;
    else if (key == "--decode_tp" && (ok = absl::SimpleAtoi(value, &n)))
      config.decode_tp = n;
    else if (key == "--layers" && (ok = absl::SimpleAtoi(value, &n)))
      config.model.layers = n;
    else if (key == "--seed" && (ok = absl::SimpleAtoi(value, &n)))
      work.seed = n;
    else if (key == "--seconds" && (ok = absl::SimpleAtod(value, &d)))
      work.seconds = d;
    else if (key == "--rate" && (ok = absl::SimpleAtod(value, &d)))
      work.rate_per_s = d;
    else if (key == "--median_tokens" && (ok = absl::SimpleAtod(value, &d)))
      work.median_tokens = d;
    else if (key == "--tokens_per_s" && (ok = absl::SimpleAtod(value, &d)))
      config.prefill_tokens_per_s = d;
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr,
                   "cluster_sim: bad argument '%s' (see the comment at the top of "
                   "tests/sim/cluster_sim_main.cc)\n",
                   arg.c_str());
      return 2;
    }
  }
  const std::string path =
      absl::StrContains(fixture, "/") ? fixture : "topology/fixtures/" + fixture + ".textproto";
  auto desc = topology::LoadTopologyFile(path);
  if (!desc.ok()) {
    std::fprintf(stderr, "cluster_sim: %s\n", desc.status().ToString().c_str());
    return 1;
  }
  config.node = *desc;
  sim::Workload workload;
  if (!trace.empty()) {
    std::ifstream in(trace);
    std::stringstream text;
    text << in.rdbuf();
    auto w = sim::WorkloadFromCsv(text.str());
    if (!in || !w.ok()) {
      std::fprintf(stderr, "cluster_sim: --trace=%s: %s\n", trace.c_str(),
                   in ? w.status().ToString().c_str() : "cannot read");
      return 1;
    }
    workload = *std::move(w);
  } else {
    workload = sim::SyntheticWorkload(work);
  }
  if (!save_trace.empty()) std::ofstream(save_trace) << sim::WorkloadToCsv(workload);
  std::printf(
      "cluster: %d nodes (%d prefill, %d decode) of %s, %zu GPUs; prefill TP%d, decode "
      "TP%d; %zu requests\n",
      config.nodes, config.prefill_nodes, config.nodes - config.prefill_nodes,
      desc->hostname().c_str(), static_cast<size_t>(config.nodes) * desc->gpus_size(),
      config.prefill_tp, config.decode_tp, workload.requests.size());
  std::fflush(stdout);
  auto report = sim::RunSimulation(config, workload);
  if (!report.ok()) {
    std::fprintf(stderr, "cluster_sim: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::printf("%s", sim::FormatReport(*report).c_str());
  return report->completed == report->requests ? 0 : 1;
}
