// The submission and completion queues against the packet path, host engine, one printed table:
// a 4 KiB transfer's submit -> completion seen by the C++ client (p50/p99 of sequential
// transfers: "seen" with Client::WaitEnd, the end as the completion queue holds it, no call;
// "wait" with Client::Wait, the daemon's whole status, one WAIT round trip after the end), three
// such transfers submitted as one batch (Client::SubmitBatch: K, V and aux of a chunk) -> all
// three seen, and the batch status of 10,000 ended transfers (Client::LocalStates with the
// completion queue; one GetTransfer each without: what kvrail_poll does), and in sq mode a
// cancel's round trip (Client::Cancel: a CANCEL packet, against CancelTransfer over gRPC in the
// same run). Modes: "sq"
// (submission and completion queues), "queue" (completion queue, SUBMIT packets), "packets"
// (neither). Each figure is taken `runs` times (default 3); median/min/max printed.
// A second table: what the spins cost (CPU time of kvraild's threads from
// /proc/PID/task/*/schedstat, of this process from getrusage) at idle, back to back, at a decode
// cadence (one 4 KiB transfer every 2 ms on an absolute schedule, sq mode) and at an irregular
// one (gaps drawn uniformly from 0.5-3.5 ms), with kvraild's spin budget at its default
// (session_spin_budget_percent 10) with predictive wake off and on, and uncapped (100, off):
// three daemons in the same run, interleaved.
// Starts its own kvraild from runfiles or ./daemon/kvraild.
// Usage: completion_bench [runs] [--first-table-only]
#include <dirent.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/kvrail_client.h"
#include "tests/bench/host_pools.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// One configuration's figures: p50 and p99 (us) of 4 KiB submit -> completion, batch status of
// 10,000 (ms).
bool RunOnce(const std::string& socket, const std::string& mode,
             std::map<std::string, std::vector<double>>* out) {
  ::setenv("KVRAIL_COMPLETION_QUEUE", mode != "packets" ? "1" : "0", 1);
  ::setenv("KVRAIL_SUBMISSION_QUEUE", mode == "sq" ? "1" : "0", 1);
  auto client = client::Client::Connect(socket);
  if (!client.ok()) return false;
  // 4 KiB blocks: 1 layer x 1 part x 256 blocks of 1 token x 1 head x 2048 bf16.
  const auto layout = testing::MakeLayout(1, 1, 256, 1, 1, 2048, v1::DTYPE_BF16,
                                          v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  absl::StatusOr<HostPools> pools = RegisterHostPools(**client, layout);
  if (!pools.ok()) return false;
  // 3,000 sequential transfers (300 warm-up), each awaited with Wait (the whole status) or
  // WaitEnd (the end from the completion queue); the latencies, and the ids into `ids`.
  std::vector<uint64_t> ids;
  const auto sequential = [&](uint32_t stride, bool end_only, std::vector<double>* lat) -> bool {
    for (int i = 0; i < 3000; ++i) {
      const auto t =
          client::MakeBlockTransfer(pools->src_region, {static_cast<uint32_t>(i % 256)},
                                    pools->dst_region, {static_cast<uint32_t>(i * stride % 256)});
      const auto t0 = Clock::now();
      auto submitted = (*client)->Submit(t);
      if (!submitted.ok()) return false;
      auto done = end_only ? (*client)->WaitEnd(submitted->transfer_id())
                           : (*client)->Wait(submitted->transfer_id());
      if (!done.ok() || done->state() != v1::TRANSFER_STATE_SUCCEEDED) return false;
      if (i >= 300) lat->push_back(Us(Clock::now() - t0));
      if (!end_only) ids.push_back(submitted->transfer_id());
    }
    return true;
  };
  std::vector<double> lat;
  if (!sequential(7, false, &lat)) return false;
  (*out)["wait_p50_us"].push_back(Percentile(lat, 0.5));
  (*out)["wait_p99_us"].push_back(Percentile(lat, 0.99));
  // The same, the end seen from the completion queue (no call after it).
  lat.clear();
  if (!sequential(5, true, &lat)) return false;
  (*out)["seen_p50_us"].push_back(Percentile(lat, 0.5));
  (*out)["seen_p99_us"].push_back(Percentile(lat, 0.99));
  // Three transfers as one batch -> all three seen.
  std::vector<double> batch_lat;
  for (int i = 0; i < 1000; ++i) {
    std::vector<v1::TransferSpec> specs;
    for (uint32_t k = 0; k < 3; ++k) {
      specs.push_back(client::MakeBlockTransfer(pools->src_region, {(i * 3 + k) % 256u},
                                                pools->dst_region, {(i * 5 + k) % 256u}));
    }
    const auto t0 = Clock::now();
    std::vector<absl::StatusOr<v1::SubmitTransferResponse>> submitted =
        (*client)->SubmitBatch(specs);
    for (const auto& r : submitted) {
      if (!r.ok()) return false;
      auto done = (*client)->WaitEnd(r->transfer_id());
      if (!done.ok() || done->state() != v1::TRANSFER_STATE_SUCCEEDED) return false;
    }
    if (i >= 100) batch_lat.push_back(Us(Clock::now() - t0));
  }
  (*out)["batch3_seen_p50_us"].push_back(Percentile(batch_lat, 0.5));
  // The path really taken: with the queue every request went through it.
  const auto [queued, handed_back] = (*client)->SubmissionQueueCounts();
  if ((mode == "sq") != (queued > 0) || handed_back > 0) {
    std::fprintf(stderr, "mode %s: %llu requests queued, %llu handed back to packets\n",
                 mode.c_str(), static_cast<unsigned long long>(queued),
                 static_cast<unsigned long long>(handed_back));
    return false;
  }
  // Batch status of 10,000 ended transfers.
  ids.resize(3000);
  std::vector<uint64_t> batch;
  while (batch.size() < 10000) batch.insert(batch.end(), ids.begin(), ids.end());
  batch.resize(10000);
  std::vector<int32_t> states(batch.size());
  const auto t0 = Clock::now();
  (*client)->LocalStates(batch.data(), batch.size(), states.data());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (states[i] != 0) continue;  // what the queue cannot tell: one call each
    auto s = (*client)->Get(batch[i]);
    if (!s.ok()) return false;
    states[i] = s->state();
  }
  (*out)["poll_10000_ms"].push_back(Us(Clock::now() - t0) / 1000);
  for (int32_t s : states) {
    if (s != v1::TRANSFER_STATE_SUCCEEDED) return false;
  }
  // A cancel's round trip, after the batch status (whose ids it must not crowd out of the
  // completion table): a layer-wise transfer waiting for its layers, cancelled by its
  // submitter (returns the cancelled status): the client's default, a CANCEL packet on the
  // session's connection, against CancelTransfer over gRPC (a client connected with
  // KVRAIL_SUBMIT_VIA=grpc), interleaved. Once, in sq mode: the path of the submit does not
  // change the cancel's.
  if (mode == "sq") {
    ::setenv("KVRAIL_SUBMIT_VIA", "grpc", 1);
    auto grpc_client = client::Client::Connect(socket);
    ::unsetenv("KVRAIL_SUBMIT_VIA");
    if (!grpc_client.ok()) return false;
    absl::StatusOr<HostPools> grpc_pools = RegisterHostPools(**grpc_client, layout);
    if (!grpc_pools.ok()) return false;
    std::vector<double> via_session, via_grpc;
    for (int i = 0; i < 1100; ++i) {
      for (bool session : {true, false}) {
        client::Client& c = session ? **client : **grpc_client;
        const HostPools& p = session ? *pools : *grpc_pools;
        auto t = client::MakeBlockTransfer(p.src_region, {static_cast<uint32_t>(i % 256)},
                                           p.dst_region, {static_cast<uint32_t>(i * 3 % 256)});
        t.set_layerwise(true);  // waits for its layers: there is something to cancel
        auto submitted = c.Submit(t);
        if (!submitted.ok()) return false;
        const auto c0 = Clock::now();
        auto cancelled = c.Cancel(submitted->transfer_id());
        const double us = Us(Clock::now() - c0);
        if (!cancelled.ok() || cancelled->state() != v1::TRANSFER_STATE_CANCELLED) return false;
        if (i >= 100) (session ? via_session : via_grpc).push_back(us);
      }
    }
    (*out)["cancel_p50_us"].push_back(Percentile(via_session, 0.5));
    (*out)["cancel_p99_us"].push_back(Percentile(via_session, 0.99));
    (*out)["cancel_grpc_p50_us"].push_back(Percentile(via_grpc, 0.5));
    (*out)["cancel_grpc_p99_us"].push_back(Percentile(via_grpc, 0.99));
  }
  return true;
}

// CPU time of every thread of process `pid` so far (schedstat: nanoseconds on a CPU).
double ProcessCpuMs(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  double ns = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(dir + "/" + e->d_name + "/schedstat");
      double run = 0;
      if (in >> run) ns += run;
    }
    ::closedir(d);
  }
  return ns / 1e6;
}

double SelfCpuMs() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

// The spins' cost against daemon `pid`: the seen p50 back to back (1,000 transfers); at one 4 KiB
// transfer every 2 ms for 1 s (submit, WaitEnd) the seen p50, submit -> acknowledgement p50, its
// CPU share and this process's; its CPU share at idle after that cadence stops (a connected sq
// client doing nothing for 1 s); the same figures at gaps drawn from 0.5-3.5 ms for 1 s.
bool CadenceOnce(const std::string& socket, pid_t pid,
                 std::map<std::string, std::vector<double>>* out) {
  ::setenv("KVRAIL_COMPLETION_QUEUE", "1", 1);
  ::setenv("KVRAIL_SUBMISSION_QUEUE", "1", 1);
  auto client = client::Client::Connect(socket);
  if (!client.ok()) return false;
  const auto layout = testing::MakeLayout(1, 1, 256, 1, 1, 2048, v1::DTYPE_BF16,
                                          v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  absl::StatusOr<HostPools> pools = RegisterHostPools(**client, layout);
  if (!pools.ok()) return false;
  std::vector<double> ack_us;
  auto one = [&](int i) -> double {
    const auto t =
        client::MakeBlockTransfer(pools->src_region, {static_cast<uint32_t>(i % 256)},
                                  pools->dst_region, {static_cast<uint32_t>(i * 3 % 256)});
    const auto t0 = Clock::now();
    auto submitted = (*client)->Submit(t);
    if (!submitted.ok()) return -1;
    const auto t1 = Clock::now();
    auto done = (*client)->WaitEnd(submitted->transfer_id());
    if (!done.ok() || done->state() != v1::TRANSFER_STATE_SUCCEEDED) return -1;
    ack_us.push_back(Us(t1 - t0));
    return Us(Clock::now() - t0);
  };
  for (int i = 0; i < 50; ++i) {
    if (one(i) < 0) return false;
  }
  // Back to back.
  std::vector<double> lat;
  for (int i = 0; i < 1000; ++i) {
    const double us = one(i);
    if (us < 0) return false;
    lat.push_back(us);
  }
  (*out)["b2b_seen_p50_us"].push_back(Percentile(lat, 0.5));
  // A decode cadence, one transfer every 2 ms, then an irregular one; `gap()` before each.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> irregular_us(500, 3500);
  const auto paced = [&](const std::string& name,
                         const std::function<std::chrono::microseconds()>& gap) -> bool {
    lat.clear();
    ack_us.clear();
    const auto w0 = Clock::now();
    const double d0 = ProcessCpuMs(pid);
    const double c0 = SelfCpuMs();
    auto next = Clock::now();
    for (int i = 0; i < 500; ++i) {
      next += gap();
      const double us = one(i);
      if (us < 0) return false;
      lat.push_back(us);
      std::this_thread::sleep_until(next);
    }
    const double wall_ms = Us(Clock::now() - w0) / 1e3;
    (*out)[name + "_daemon_cpu_pct"].push_back((ProcessCpuMs(pid) - d0) / wall_ms * 100);
    (*out)[name + "_client_cpu_pct"].push_back((SelfCpuMs() - c0) / wall_ms * 100);
    (*out)[name + "_seen_p50_us"].push_back(Percentile(lat, 0.5));
    (*out)[name + "_ack_p50_us"].push_back(Percentile(ack_us, 0.5));
    return true;
  };
  if (!paced("2ms", [] { return std::chrono::microseconds(2000); })) return false;
  // Idle from the cadence's stop on (1 s): the spins that follow the last transfer and
  // predictive wake's one missed window, then nothing.
  const auto w0 = Clock::now();
  const double d0 = ProcessCpuMs(pid);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  (*out)["idle_daemon_cpu_pct"].push_back((ProcessCpuMs(pid) - d0) / (Us(Clock::now() - w0) / 1e3) *
                                          100);
  return paced("irregular", [&] { return std::chrono::microseconds(irregular_us(rng)); });
}

int Main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const bool first_table_only = argc > 2 && std::string(argv[2]) == "--first-table-only";
  testing::TempDir dir;
  testing::DaemonProcess daemon;
  daemon.set_log_level("info");  // a benchmark: no per-transfer debug lines
  if (!daemon.Start(dir.path())) {
    std::fprintf(stderr, "kvraild did not start\n");
    return 1;
  }
  std::printf(
      "submission queue vs completion queue vs packets, 4 KiB host transfers, C++ client "
      "(%d runs)\n",
      runs);
  std::printf("%-8s %-14s %10s %10s %10s\n", "path", "figure", "median", "min", "max");
  for (const std::string mode : {"sq", "queue", "packets"}) {
    std::map<std::string, std::vector<double>> figures;
    for (int r = 0; r < runs; ++r) {
      if (!RunOnce(daemon.socket(), mode, &figures)) {
        std::fprintf(stderr, "run failed\n");
        return 1;
      }
    }
    for (auto& [name, xs] : figures) {
      std::printf("%-8s %-14s %10.1f %10.1f %10.1f\n", mode.c_str(), name.c_str(),
                  Percentile(xs, 0.5), *std::min_element(xs.begin(), xs.end()),
                  *std::max_element(xs.begin(), xs.end()));
    }
  }
  if (first_table_only) return 0;
  // The spins' cost: the default budget with predictive wake off and on, and no cap (off):
  // three daemons, interleaved runs. The first table's daemon is left as it was (the defaults).
  struct Setting {
    const char* label;
    const char* config;
    testing::TempDir dir;
    testing::DaemonProcess daemon;
    std::map<std::string, std::vector<double>> figures;
  };
  Setting settings[] = {
      {"10%", "predictive_wake: false\n", {}, {}, {}},
      {"10%+predict", "predictive_wake: true\n", {}, {}, {}},
      {"uncapped", "session_spin_budget_percent: 100\npredictive_wake: false\n", {}, {}, {}},
  };
  for (Setting& setting : settings) {
    const std::string config = setting.dir.path() + "/kvraild.textproto";
    std::ofstream(config) << setting.config;
    setting.daemon.set_log_level("info");  // a benchmark: no per-transfer debug lines
    if (!setting.daemon.Start(setting.dir.path(), {"--config", config}, true, "kvraild.log",
                              20000)) {
      std::fprintf(stderr, "the %s kvraild did not start:\n%s\n", setting.label,
                   setting.daemon.ReadLog().c_str());
      return 1;
    }
  }
  for (int r = 0; r < runs; ++r) {
    for (Setting& setting : settings) {
      if (!CadenceOnce(setting.daemon.socket(), setting.daemon.pid(), &setting.figures)) {
        std::fprintf(stderr, "cadence run failed (%s)\n", setting.label);
        return 1;
      }
    }
  }
  std::printf(
      "\nspin cost, sq mode: seen p50 and kvraild / client CPU (%% of one core) at idle, back to "
      "back, at one 4 KiB transfer every 2 ms and at gaps of 0.5-3.5 ms (%d runs; budget: "
      "session_spin_budget_percent, +predict: predictive_wake on)\n",
      runs);
  std::printf("%-12s %-26s %10s %10s %10s\n", "budget", "figure", "median", "min", "max");
  for (const Setting& setting : settings) {
    for (const auto& [name, xs] : setting.figures) {
      std::printf("%-12s %-26s %10.1f %10.1f %10.1f\n", setting.label, name.c_str(),
                  Percentile(xs, 0.5), *std::min_element(xs.begin(), xs.end()),
                  *std::max_element(xs.begin(), xs.end()));
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvrail::bench

int main(int argc, char** argv) { return kvrail::bench::Main(argc, argv); }
