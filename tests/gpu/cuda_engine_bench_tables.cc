// cuda_engine_bench's other tables (2, 3, 4): submit -> completion latency of a 16 MiB transfer,
// the SM budget sweep, and the source GPU -> pinned host memory.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/gpu/cuda_engine_bench_fixture.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::engine_bench {

void LatencyTable(const Run& run) {
  const std::string& where = run.where;
  const int dst_device = run.dst_device;
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
        by_flag[by_flag.size() / 2] * 1e6, by_flag[by_flag.size() * 9 / 10] * 1e6, by_flag[0] * 1e6,
        by_flag.back() * 1e6);
    (void)d.client->UnregisterRegion(flags.region_id());
  }
  Release(d, p);
}

void SmSweepTable(const Run& run) {
  const std::string& where = run.where;
  const int reps = run.reps;
  const uint64_t total = run.total;
  const bool quick = run.quick;
  const int dst_device = run.dst_device;
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
  if (dst_device != run.src) {
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

void HostTable(const Run& run) {
  const int reps = run.reps;
  const uint64_t total = run.total;
  std::printf(
      "\n## 4. GPU%d -> pinned host memory through kvraild at its shipped defaults (32 "
      "KiB blocks), GB/s median (min-max) of %d\n",
      run.src, reps);
  Daemon d({});
  Pools p = MakePools(d, 32 << 10, total / 2, true, run.src);
  std::string engine, path;
  const Spread g = ThroughSpread(d, p, reps, &engine, &path);
  std::printf("%s GB/s, %s, %s\n", Cell(g).c_str(), engine.c_str(), path.c_str());
  Release(d, p);
}

}  // namespace kvrail::engine_bench
