// Head of line on the session socket: a small tenant's 4 KiB transfer (submit -> completion seen
// by the C++ client through its completion queue, as the 4 KiB target is; sequential, p50/p99)
// unloaded and beside another tenant that keeps submitting a very large transfer (2^20 blocks per
// side by default, ids in a shared block table, every id checked at admission:
// defer_id_checks_from 0; layer-wise and cancelled once answered, so it never occupies the
// engine), with SUBMITs admitted on the poll thread (session_admission_workers 0, the old
// behaviour), by four workers at normal priority (session_admission_bulk_workers 0: no bulk
// class), and at the shipped default: four workers plus one bulk worker that admits the large
// SUBMIT in SCHED_IDLE, lifted at its deadline by the starvation guard (where kvraild may not lift
// a thread out of SCHED_IDLE it starts no bulk worker, and the bench prints kvraild's warning
// under the table). One kvraild per setting, host engine; each figure taken `runs` times, median
// and min/max printed, plus the large SUBMIT's admission time
// (received -> answered, the daemon's timestamps), the ratio of the p99 beside the large SUBMIT
// to the same setting's unloaded p99 (the target: at most 2), and the load average before and
// after. For the slowest 1% of the small tenant's transfers, the median of each phase (the
// daemon's timestamps against the client's clock): to the daemon, accept, queued, run, and back
// (finished -> seen by the client), to show where the tail is. With a pace, the large tenant
// waits that long between its SUBMITs (a tenant whose large transfer then runs for a while)
// instead of resubmitting back to back, so its rounds (the client writing the ids again, its
// Cancel and Wait) weigh less beside the small tenant on a machine of few cores. A last row is
// the machine's floor: beside the shipped default's kvraild the large tenant only does its own
// part of a round (copying 2 x 2^20 ids, as the client library does into its shared table at
// each SUBMIT, then pausing as long as an admission takes) and asks kvraild for nothing: on a
// machine whose cores the small tenant's spinning threads already fill, this alone moves the
// small tenant's p99, and no admission scheme can do better than it.
//
// Usage: admission_bench [runs (3)] [small transfers per run (1000)]
//                        [log2 of the large SUBMIT's blocks per side (20)]
//                        [ms between the large tenant's SUBMITs (0: back to back)]
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/kvrail_client.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

struct Region {
  std::unique_ptr<client::HostBuffer> buffer;
  uint64_t id = 0;
};

bool Register(client::Client& c, const v1::PagedKvLayout& layout, bool writable, Region* out) {
  auto buffer = c.CreateHostBuffer(testing::LayoutBytes(layout));
  if (!buffer.ok()) return false;
  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_writable(writable);
  *spec.mutable_paged_kv() = layout;
  auto info = c.RegisterHostBuffer(**buffer, spec);
  if (!info.ok()) return false;
  out->buffer = *std::move(buffer);
  out->id = info->region_id();
  return true;
}

std::vector<uint32_t> Shuffled(uint32_t n, uint32_t seed) {
  std::vector<uint32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0u);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  return ids;
}

// One run against `socket`: the small tenant's latencies, with the large tenant submitting in a
// loop when `loaded`. Adds p50_us, p99_us (and admit_ms when loaded) to `out`.
bool RunOnce(const std::string& socket, bool loaded, bool copy_only, int transfers,
             uint32_t large_blocks, int pace_ms, std::map<std::string, std::vector<double>>* out) {
  auto small = client::Client::Connect(socket);
  auto large = client::Client::Connect(socket);
  if (!small.ok() || !large.ok()) return false;
  // 4 KiB blocks: 1 layer x 1 part x 256 blocks of 1 token x 1 head x 2048 bf16.
  const auto four_kib = testing::MakeLayout(1, 1, 256, 1, 1, 2048, v1::DTYPE_BF16,
                                            v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  // 16-byte blocks (2^20 of them: 16 MiB).
  const auto tiny = testing::MakeLayout(1, 1, large_blocks, 1, 1, 8, v1::DTYPE_BF16,
                                        v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Region a, b, la, lb;
  if (!Register(**small, four_kib, false, &a) || !Register(**small, four_kib, true, &b) ||
      !Register(**large, tiny, false, &la) || !Register(**large, tiny, true, &lb)) {
    return false;
  }
  v1::TransferSpec large_spec =
      client::MakeBlockTransfer(la.id, Shuffled(large_blocks, 1), lb.id, Shuffled(large_blocks, 2));
  // Admitted, then waiting for layers never marked until cancelled: the engine stays free for
  // the small tenant, so the large tenant's cost to it is admission (and CPU) alone.
  large_spec.set_layerwise(true);
  std::atomic<bool> stop{false}, failed{false};
  std::vector<double> admit_ms;
  std::thread large_thread;
  if (loaded) {
    large_thread = std::thread([&] {
      if (copy_only) {
        // The machine's floor: the large tenant's own work at each round (writing its 2 x
        // 2^20 ids, what the client library copies into the shared table per SUBMIT) and a
        // pause the length of its admission, without kvraild.
        std::vector<uint32_t> ids(2 * size_t{large_blocks}), table(2 * size_t{large_blocks});
        std::iota(ids.begin(), ids.end(), 0u);
        while (!stop.load()) {
          std::memcpy(table.data(), ids.data(), 4 * ids.size());
          std::this_thread::sleep_for(std::chrono::microseconds(2500));
          if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
        }
        return;
      }
      while (!stop.load()) {
        auto submitted = (*large)->Submit(large_spec);
        if (!submitted.ok()) {
          std::fprintf(stderr, "large submit: %s\n", submitted.status().ToString().c_str());
          failed.store(true);
          return;
        }
        (void)(*large)->Cancel(submitted->transfer_id());
        auto ended = (*large)->Wait(submitted->transfer_id());
        if (ended.ok()) {
          admit_ms.push_back((ended->submitted_unix_us() - ended->received_unix_us()) / 1000.0);
        }
        if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
      }
    });
    // The first large SUBMIT under way before the small tenant starts.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<double> lat;
  // Each transfer is timed to its end as the client sees it (WaitEnd: the completion queue, no
  // call after it), as the 4 KiB target is; its daemon timestamps are read after the run
  // (outside the timed loop and the large tenant's loop) for the phases: to the daemon (sent ->
  // received), accept (-> submitted), queued (-> started), run (-> finished), back (-> seen).
  struct Sent {
    uint64_t id;
    int64_t sent_us, seen_us;
  };
  std::vector<Sent> sent;
  for (int i = 0; i < transfers && !failed.load(); ++i) {
    const auto t = client::MakeBlockTransfer(a.id, {static_cast<uint32_t>(i % 256)}, b.id,
                                             {static_cast<uint32_t>(i * 7 % 256)});
    const auto t0 = Clock::now();
    const int64_t sent_us = absl::ToUnixMicros(absl::Now());
    auto submitted = (*small)->Submit(t);
    if (!submitted.ok()) return false;
    auto done = (*small)->WaitEnd(submitted->transfer_id(), absl::Seconds(60));
    if (!done.ok() || done->state() != v1::TRANSFER_STATE_SUCCEEDED) return false;
    lat.push_back(Us(Clock::now() - t0));
    sent.push_back({submitted->transfer_id(), sent_us, absl::ToUnixMicros(absl::Now())});
  }
  stop.store(true);
  if (large_thread.joinable()) large_thread.join();
  if (failed.load() || lat.empty()) return false;
  std::vector<std::array<double, 5>> phases;
  for (const Sent& x : sent) {
    auto done = (*small)->Get(x.id);
    if (!done.ok()) return false;
    phases.push_back({static_cast<double>(done->received_unix_us() - x.sent_us),
                      static_cast<double>(done->submitted_unix_us() - done->received_unix_us()),
                      static_cast<double>(done->started_unix_us() - done->submitted_unix_us()),
                      static_cast<double>(done->finished_unix_us() - done->started_unix_us()),
                      static_cast<double>(x.seen_us - done->finished_unix_us())});
  }
  (*out)["p50_us"].push_back(Percentile(lat, 0.5));
  (*out)["p99_us"].push_back(Percentile(lat, 0.99));
  // Where the slowest 1% spent their time: each phase's median over them.
  const double tail = Percentile(lat, 0.99);
  static const char* const kPhase[] = {"tail: to daemon us", "tail: accept us", "tail: queued us",
                                       "tail: run us", "tail: back us"};
  for (int k = 0; k < 5; ++k) {
    std::vector<double> xs;
    for (size_t j = 0; j < lat.size(); ++j) {
      if (lat[j] >= tail) xs.push_back(phases[j][k]);
    }
    (*out)[kPhase[k]].push_back(Percentile(xs, 0.5));
  }
  if (!admit_ms.empty()) (*out)["admit_ms"].push_back(Percentile(admit_ms, 0.5));
  return true;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

struct Setting {
  const char* name;
  const char* config;      // the admission fields of kvraild's config (none: the shipped default)
  bool copy_only = false;  // the large tenant only copies its ids (RunOnce)
};

int Main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const int transfers = argc > 2 ? std::max(10, std::atoi(argv[2])) : 1000;
  const int log2_blocks = argc > 3 ? std::clamp(std::atoi(argv[3]), 10, 24) : 20;
  const uint32_t large_blocks = uint32_t{1} << log2_blocks;
  const int pace_ms = argc > 4 ? std::clamp(std::atoi(argv[4]), 0, 10000) : 0;
  const std::string large_tenant = pace_ms > 0
                                       ? absl::StrCat("waits ", pace_ms, " ms between SUBMITs")
                                       : "resubmits back to back";
  std::printf(
      "small tenant's 4 KiB submit -> completion beside a 2^%d-block SUBMIT, host engine "
      "(%d runs of %d transfers; the large tenant %s)\n",
      log2_blocks, runs, transfers, large_tenant.c_str());
  std::printf("load average before: %s\n", LoadAverage().c_str());
  std::printf(
      "| admission | small tenant | figure | median | min | max |\n"
      "|---|---|---|---|---|---|\n");
  const Setting settings[] = {
      {"poll thread (old)", "session_admission_workers: 0\n"},
      {"4 workers, no bulk class",
       "session_admission_workers: 4\nsession_admission_bulk_workers: 0\n"},
      {"shipped default: 4 workers + 1 bulk (SCHED_IDLE, guarded)", ""},
      {"floor: the large tenant only copies its ids, no kvraild work", "", true}};
  std::vector<std::string> warnings;
  for (const Setting& setting : settings) {
    testing::TempDir dir;
    const std::string config = dir.path() + "/kvraild.textproto";
    std::ofstream(config) << setting.config << "defer_id_checks_from: 0\n";
    testing::DaemonProcess daemon;
    daemon.set_log_level("info");  // a benchmark: no per-transfer debug lines
    if (!daemon.Start(dir.path(), {"--config", config})) {
      std::fprintf(stderr, "kvraild did not start\n");
      return 1;
    }
    const std::string name = setting.name;
    double unloaded_p99 = 0;
    for (bool loaded : {false, true}) {
      std::map<std::string, std::vector<double>> figures;
      for (int r = 0; r < runs; ++r) {
        if (!RunOnce(daemon.socket(), loaded, setting.copy_only, transfers, large_blocks, pace_ms,
                     &figures)) {
          std::fprintf(stderr, "run failed\n");
          return 1;
        }
      }
      for (auto& [figure, xs] : figures) {
        std::printf("| %s | %s | %s | %.1f | %.1f | %.1f |\n", name.c_str(),
                    loaded ? "beside large" : "unloaded", figure.c_str(), Percentile(xs, 0.5),
                    *std::min_element(xs.begin(), xs.end()),
                    *std::max_element(xs.begin(), xs.end()));
      }
      const double p99 = Percentile(figures["p99_us"], 0.5);
      if (!loaded) {
        unloaded_p99 = p99;
      } else {
        std::printf("| %s | beside large / unloaded | p99 ratio (target <= 2) | %.2f | - | - |\n",
                    name.c_str(), p99 / unloaded_p99);
      }
      std::fflush(stdout);
    }
    // What kvraild said of its admission set-up (the bulk class not started, and why).
    std::istringstream log(daemon.ReadLog());
    for (std::string line; std::getline(log, line);) {
      if (line.find("session admission:") != std::string::npos) {
        warnings.push_back(name + ": " + line);
      }
    }
  }
  std::printf("load average after: %s\n", LoadAverage().c_str());
  for (const std::string& warning : warnings) std::printf("kvraild: %s\n", warning.c_str());
  return 0;
}

}  // namespace
}  // namespace kvrail::bench

int main(int argc, char** argv) { return kvrail::bench::Main(argc, argv); }
