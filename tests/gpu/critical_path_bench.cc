// The critical path through the real kvraild, sources on --src-gpu and destinations on --dst-gpu
// (GPU0 -> GPU0 by default). Parts (the first argument, default all):
//  split    kernel and copy engines together: 256 MiB of scattered 4 / 32 / 128 KiB blocks with
//           the kernel alone (cuda_copy_split_max_percent 0), the learned split (default), fixed
//           10% and 30% shares, and the copy engines alone; median of 10 after 6 warm transfers,
//           one daemon per setting; the destination blocks of the last transfer are compared
//           with the source byte for byte; the engine's stats line (the split decision) printed.
//  first    the first transfer after kvraild starts (512 MiB of scattered 16 KiB blocks), with
//           where its time goes: the client's Submit call up to the daemon's receipt, the
//           daemon's accept, queued (submit -> first tile started), running, and the client's
//           Wait after the daemon's finish; then the warm medians, a fresh daemon per row.
//  latency  a 16 MiB critical transfer (1024 x 16 KiB blocks), submit -> completion seen by the
//           client, p50 / p90 of 200 after 20 warm-ups, with the phase medians; rows for the
//           daemon's settings (among them plans kept warm off, against the default beside it).
// Rows print the median with min-max of their runs. Needs daemon/kvraild through
// TEST_SRCDIR/TEST_WORKSPACE, as the GPU tests do.
//  doneword the same 16 MiB transfer, submit -> done seen by a client polling LocalStates, with
//           the GPU-written done word and without (KVRAIL_GPU_DONE_WORD=0), 3 fresh daemons each.
//  cadence  latency's transfer at a decode step's cadence (2 ms between transfers) with the hot
//           path's spins set to cover the gap (daemon: session_submission_spin_us,
//           cuda_dispatcher_spin_us and their budgets; client: KVRAIL_SUBMISSION_SPIN_US,
//           KVRAIL_COMPLETION_SPIN_US, KVRAIL_ANSWER_SPIN_US), against the defaults back to
//           back and at the cadence in the same run: p50 / p90 with the phase medians and the CPU
//           each side used over the measured transfers (kvraild: utime + stime of its pid from
//           /proc/PID/stat; the client: this process's getrusage), as percent of one core; and
//           predictive wake (predictive_wake: the poll thread and the dispatcher sleep most of
//           the gap and spin around the next transfer) at the shipped budgets.
//           Median (min-max) of 3 fresh daemons per setting, the settings interleaved.
// Usage: critical_path_bench [split|first|latency|doneword|cadence|all] [--src-gpu N]
//                            [--dst-gpu N]
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "tests/gpu/bench_check.h"
#include "tests/gpu/bench_daemon.h"
#include "tests/harness/daemon_process.h"

namespace kvrail {
namespace {

using Clock = std::chrono::steady_clock;
using gpu_bench::Check;
using gpu_bench::Must;

gpu_bench::GpuPair g_pair;  // set once by main: sources on src, destinations on dst

double UnixUs() { return absl::ToDoubleMicroseconds(absl::Now() - absl::UnixEpoch()); }

// Environment variables set for one row (the daemon inherits them; the client reads
// KVRAIL_ANSWER_SPIN_US when it connects), removed afterwards.
struct ScopedEnv {
  std::vector<std::string> names;
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> vars) {
    for (const auto& [k, v] : vars) {
      setenv(k.c_str(), v.c_str(), 1);
      names.push_back(k);
    }
  }
  ~ScopedEnv() {
    for (const auto& k : names) unsetenv(k.c_str());
  }
};
// The critical-path settings off: the daemon's spins and staged plan uploads
// (KVRAILD_LOW_LATENCY=off) and the client's answer spin.
const std::vector<std::pair<std::string, std::string>> kAllOff = {{"KVRAILD_LOW_LATENCY", "off"},
                                                                  {"KVRAIL_ANSWER_SPIN_US", "0"}};

// A kvraild with DaemonConfig textproto lines `config` (gpu_bench::BenchDaemon).
struct Daemon : gpu_bench::BenchDaemon {
  explicit Daemon(const std::string& config) : BenchDaemon(config, {}) {}
};

// One layer, one part: a block is tokens x heads x 128 bf16.
v1::PagedKvLayout BlockLayout(uint32_t blocks, uint64_t block_bytes) {
  v1::PagedKvLayout l;
  l.set_num_layers(1);
  l.set_num_parts(1);
  l.set_num_blocks(blocks);
  l.set_num_heads(block_bytes >= (32 << 10) ? 8 : 1);
  l.set_head_dim(128);
  l.set_tokens_per_block(static_cast<uint32_t>(block_bytes / (l.num_heads() * 128 * 2)));
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return l;
}

struct Pool {
  std::unique_ptr<client::CudaBuffer> buffer;
  v1::RegionInfo region;
  std::vector<uint8_t> host;  // the source's bytes
};

Pool MakePool(Daemon& d, const v1::PagedKvLayout& layout, uint64_t bytes, bool writable) {
  Pool p;
  const int device = writable ? g_pair.dst : g_pair.src;
  p.buffer = Must(client::CudaBuffer::Create(device, bytes), "cuda buffer");
  Check(cudaSetDevice(device), "cudaSetDevice");
  if (writable) {
    Check(cudaMemset(p.buffer->data(), 0xAB, bytes), "poison");
  } else {
    p.host.resize(bytes);
    std::mt19937_64 rng(7);
    for (size_t i = 0; i < bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(p.host.data() + i, &v, std::min<size_t>(8, bytes - i));
    }
    Check(cudaMemcpy(p.buffer->data(), p.host.data(), bytes, cudaMemcpyHostToDevice), "upload");
  }
  Check(cudaSetDevice(g_pair.src), "cudaSetDevice");
  v1::RegionSpec spec;
  spec.set_name(writable ? "dst" : "src");
  spec.set_writable(writable);
  *spec.mutable_paged_kv() = layout;
  p.region = Must(client::RegisterCudaRegion(*d.client, p.buffer->data(), bytes, spec), "register");
  return p;
}

std::vector<uint32_t> Scattered(uint32_t pool, uint32_t n, std::mt19937_64& rng) {
  std::vector<uint32_t> ids(pool);
  std::iota(ids.begin(), ids.end(), 0u);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n);
  return ids;
}

struct Timed {
  double seconds = 0;
  double u0 = 0, u_submitted = 0, u_done = 0;  // client unix us: call, Submit back, Wait back
  v1::TransferStatus status;
};

// `seen_end`: the end as the completion queue (or the done word) holds it (WaitEnd, no call after
// it; its status has no phase timestamps), else the whole status (Wait: one call after the end).
Timed RunTransfer(Daemon& d, const v1::TransferSpec& spec, bool seen_end = false) {
  Timed t;
  const auto t0 = Clock::now();
  t.u0 = UnixUs();
  auto submitted = Must(d.client->Submit(spec), "submit");
  t.u_submitted = UnixUs();
  t.status = Must(seen_end ? d.client->WaitEnd(submitted.transfer_id(), absl::Seconds(600))
                           : d.client->Wait(submitted.transfer_id(), absl::Seconds(600)),
                  "wait");
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  t.u_done = UnixUs();
  if (t.status.state() != v1::TRANSFER_STATE_SUCCEEDED) {
    std::fprintf(stderr, "transfer failed: %s\n", t.status.ShortDebugString().c_str());
    std::exit(1);
  }
  return t;
}

// --- split ---------------------------------------------------------------------------------
void SplitRow(const char* label, const std::string& config) {
  Daemon d(config);
  std::printf("| %s |", label);
  std::vector<std::string> engines;
  for (uint64_t kib : {4, 32, 128}) {
    const uint64_t block = kib << 10;
    const uint32_t n = static_cast<uint32_t>((256ull << 20) / block);
    const uint32_t pool = 2 * n;
    const v1::PagedKvLayout layout = BlockLayout(pool, block);
    Pool src = MakePool(d, layout, uint64_t{pool} * block, false);
    Pool dst = MakePool(d, layout, uint64_t{pool} * block, true);
    std::mt19937_64 rng(kib);
    const std::vector<uint32_t> sb = Scattered(pool, n, rng), db = Scattered(pool, n, rng);
    v1::TransferSpec spec =
        client::MakeBlockTransfer(src.region.region_id(), sb, dst.region.region_id(), db);
    std::vector<double> gbps;
    std::string engine;
    for (int i = 0; i < 16; ++i) {
      const Timed t = RunTransfer(d, spec);
      if (i >= 6) gbps.push_back(n * static_cast<double>(block) / t.seconds / 1e9);
      engine = t.status.engine();
    }
    // Byte for byte: every destination block holds its source block.
    std::vector<uint8_t> got(uint64_t{pool} * block);
    Check(cudaMemcpy(got.data(), dst.buffer->data(), got.size(), cudaMemcpyDeviceToHost), "read");
    size_t wrong = 0;
    for (uint32_t i = 0; i < n; ++i) {
      wrong += std::memcmp(got.data() + uint64_t{db[i]} * block,
                           src.host.data() + uint64_t{sb[i]} * block, block) != 0;
    }
    std::printf(" %s (%s%s) |", gpu_bench::Cell(gpu_bench::SpreadOf(gbps)).c_str(), engine.c_str(),
                wrong == 0 ? "" : absl::StrCat(", ", wrong, " BLOCKS WRONG").c_str());
    std::fflush(stdout);
    engines.push_back(absl::StrCat(kib, " KiB: ", d.Engines()));
    (void)d.client->UnregisterRegion(src.region.region_id());
    (void)d.client->UnregisterRegion(dst.region.region_id());
  }
  std::printf("\n");
  for (const std::string& e : engines) std::printf("  engine after %s\n", e.c_str());
  std::fflush(stdout);
}

// --- first ---------------------------------------------------------------------------------
void FirstRow(const char* label, const std::string& config,
              std::vector<std::pair<std::string, std::string>> env = {}) {
  ScopedEnv scoped(std::move(env));
  const auto t_start = Clock::now();
  Daemon d(config);
  const double start_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_start).count();
  const uint64_t block = 16 << 10;
  const uint32_t pool = 65536, n = 32768;  // 512 MiB
  const v1::PagedKvLayout layout = BlockLayout(pool, block);
  Pool src = MakePool(d, layout, uint64_t{pool} * block, false);
  Pool dst = MakePool(d, layout, uint64_t{pool} * block, true);
  std::mt19937_64 rng(1);
  std::vector<Timed> runs;
  std::string first_engine;
  // How long the GPU sat idle before the first transfer (the daemon's warm-up is its last work):
  // the "after the same idle" runs below wait as long before each, so what the first transfer
  // still loses to a warm daemon's transfer after the same pause is the daemon's own first-time
  // cost, and the rest the GPU's return from idle, which every transfer after a pause pays.
  const auto idle = Clock::now() - t_start - std::chrono::duration<double, std::milli>(start_ms);
  for (int i = 0; i < 21; ++i) {
    v1::TransferSpec spec =
        client::MakeBlockTransfer(src.region.region_id(), Scattered(pool, n, rng),
                                  dst.region.region_id(), Scattered(pool, n, rng));
    runs.push_back(RunTransfer(d, spec));
    if (i == 0) first_engine = d.Engines();
  }
  const auto phases = [](const Timed& t) {
    const v1::TransferStatus& s = t.status;
    return std::vector<double>{s.received_unix_us() - t.u0,
                               static_cast<double>(s.submitted_unix_us() - s.received_unix_us()),
                               t.u_submitted - s.submitted_unix_us(),
                               static_cast<double>(s.started_unix_us() - s.submitted_unix_us()),
                               static_cast<double>(s.finished_unix_us() - s.started_unix_us()),
                               t.u_done - s.finished_unix_us(),
                               t.seconds * 1e6};
  };
  std::vector<std::vector<double>> warm(7);
  std::vector<double> warm_gbps;
  for (size_t i = 1; i < runs.size(); ++i) {
    const auto p = phases(runs[i]);
    for (size_t k = 0; k < p.size(); ++k) warm[k].push_back(p[k]);
    warm_gbps.push_back(n * static_cast<double>(block) / runs[i].seconds / 1e9);
  }
  for (auto& v : warm) std::sort(v.begin(), v.end());
  const gpu_bench::Spread warm_spread = gpu_bench::SpreadOf(warm_gbps);
  std::sort(warm_gbps.begin(), warm_gbps.end());
  // Two kinds of pause, five of each: the GPU left alone, and the GPU last used by this process
  // just before the transfer (as MakePool's poisoning and upload did before the first), which
  // hands the daemon a GPU running another context.
  void* scratch = nullptr;
  Check(cudaMalloc(&scratch, 1 << 20), "scratch");
  std::vector<std::vector<double>> paused(7), touched(7);
  std::vector<double> paused_gbps, touched_gbps;
  for (int i = 0; i < 10; ++i) {
    const bool touch = i % 2 == 1;
    std::this_thread::sleep_for(idle);
    if (touch) {
      Check(cudaMemset(scratch, i, 1 << 20), "touch");
      Check(cudaDeviceSynchronize(), "touch");
    }
    v1::TransferSpec spec =
        client::MakeBlockTransfer(src.region.region_id(), Scattered(pool, n, rng),
                                  dst.region.region_id(), Scattered(pool, n, rng));
    const Timed t = RunTransfer(d, spec);
    const auto p = phases(t);
    for (size_t k = 0; k < p.size(); ++k) (touch ? touched : paused)[k].push_back(p[k]);
    (touch ? touched_gbps : paused_gbps)
        .push_back(n * static_cast<double>(block) / t.seconds / 1e9);
  }
  Check(cudaFree(scratch), "scratch");
  for (auto& v : paused) std::sort(v.begin(), v.end());
  for (auto& v : touched) std::sort(v.begin(), v.end());
  std::sort(paused_gbps.begin(), paused_gbps.end());
  std::sort(touched_gbps.begin(), touched_gbps.end());
  const double paused_median = paused_gbps[2], touched_median = touched_gbps[2];
  const double first_gbps = n * static_cast<double>(block) / runs[0].seconds / 1e9;
  const double median = warm_gbps[warm_gbps.size() / 2];
  const auto f = phases(runs[0]);
  std::printf(
      "| %s | %.1f | %s | %.0f%% | %.0f / %.0f / %.0f / %.0f / %.0f / %.0f / %.0f | "
      "%.0f / %.0f / %.0f / %.0f / %.0f / %.0f / %.0f | %.0f ms: %.1f | %.0f%% | "
      "%.0f / %.0f / %.0f / %.0f / %.0f / %.0f / %.0f | %.1f | %.0f%% | "
      "%.0f / %.0f / %.0f / %.0f / %.0f / %.0f / %.0f |\n",
      label, first_gbps, gpu_bench::Cell(warm_spread).c_str(), 100 * first_gbps / median, f[0],
      f[1], f[2], f[3], f[4], f[5], f[6], warm[0][10], warm[1][10], warm[2][10], warm[3][10],
      warm[4][10], warm[5][10], warm[6][10],
      std::chrono::duration<double, std::milli>(idle).count(), paused_median,
      100 * first_gbps / paused_median, paused[0][2], paused[1][2], paused[2][2], paused[3][2],
      paused[4][2], paused[5][2], paused[6][2], touched_median, 100 * first_gbps / touched_median,
      touched[0][2], touched[1][2], touched[2][2], touched[3][2], touched[4][2], touched[5][2],
      touched[6][2]);
  std::printf("  kvraild start + connect %.1f ms; engine after the first: %s\n", start_ms,
              first_engine.c_str());
  std::printf("  engine after the last: %s\n", d.Engines().c_str());
  std::fflush(stdout);
}

// --- latency -------------------------------------------------------------------------------
// CPU seconds (user + system) kvraild's process `pid` has used, from /proc/PID/stat (clock ticks,
// every thread of the process); -1 when unreadable.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return -1;
  // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream rest(line.substr(paren + 1));
  std::string field;
  double utime = -1, stime = -1;
  for (int n = 3; n <= 15 && rest >> field; ++n) {
    if (n == 14) utime = std::stod(field);
    if (n == 15) stime = std::stod(field);
  }
  if (utime < 0 || stime < 0) return -1;
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU seconds this process (the client, every thread) has used.
double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// One latency run: submit -> completion of the measured transfers (sorted, us), the phases'
// medians, and the CPU each side used over them (percent of one core).
struct LatencyRun {
  std::vector<double> lat;
  double phase[6] = {0, 0, 0, 0, 0, 0};
  double daemon_cpu_pct = -1, client_cpu_pct = -1;
  std::string engines;
  double p50() const { return lat[lat.size() / 2]; }
  double p90() const { return lat[lat.size() * 9 / 10]; }
};

// gap_us > 0: the client sleeps that long between transfers (a decode step's cadence: the
// daemon's threads go to sleep between transfers, unlike back to back).
LatencyRun MeasureLatency(const std::string& config,
                          std::vector<std::pair<std::string, std::string>> env, int gap_us,
                          bool seen_end = false) {
  ScopedEnv scoped(std::move(env));
  Daemon d(config);
  const uint64_t block = 16 << 10;
  const uint32_t pool = 4096, n = 1024;  // 16 MiB
  const v1::PagedKvLayout layout = BlockLayout(pool, block);
  Pool src = MakePool(d, layout, uint64_t{pool} * block, false);
  Pool dst = MakePool(d, layout, uint64_t{pool} * block, true);
  std::mt19937_64 rng(3);
  v1::TransferSpec spec =
      client::MakeBlockTransfer(src.region.region_id(), Scattered(pool, n, rng),
                                dst.region.region_id(), Scattered(pool, n, rng));
  spec.set_priority(v1::PRIORITY_CRITICAL);
  std::vector<double> lat;
  std::vector<std::vector<double>> ph(6);
  double daemon_cpu0 = 0, client_cpu0 = 0;
  Clock::time_point wall0;
  for (int i = 0; i < 220; ++i) {
    if (i == 20) {
      daemon_cpu0 = ProcessCpuSeconds(d.process.pid());
      client_cpu0 = SelfCpuSeconds();
      wall0 = Clock::now();
    }
    if (gap_us > 0) absl::SleepFor(absl::Microseconds(gap_us));
    const Timed t = RunTransfer(d, spec, seen_end);
    if (i < 20) continue;
    const v1::TransferStatus& s = t.status;
    lat.push_back(t.seconds * 1e6);
    if (s.received_unix_us() == 0) continue;  // an end without the daemon's timestamps
    ph[0].push_back(s.received_unix_us() - t.u0);
    ph[1].push_back(static_cast<double>(s.submitted_unix_us() - s.received_unix_us()));
    ph[2].push_back(t.u_submitted - s.submitted_unix_us());
    ph[3].push_back(static_cast<double>(s.started_unix_us() - s.submitted_unix_us()));
    ph[4].push_back(static_cast<double>(s.finished_unix_us() - s.started_unix_us()));
    ph[5].push_back(t.u_done - s.finished_unix_us());
  }
  LatencyRun run;
  const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
  const double daemon_cpu1 = ProcessCpuSeconds(d.process.pid());
  if (daemon_cpu0 >= 0 && daemon_cpu1 >= 0) {
    run.daemon_cpu_pct = 100 * (daemon_cpu1 - daemon_cpu0) / wall;
  }
  run.client_cpu_pct = 100 * (SelfCpuSeconds() - client_cpu0) / wall;
  std::sort(lat.begin(), lat.end());
  for (auto& v : ph) std::sort(v.begin(), v.end());
  for (int k = 0; k < 6; ++k) {
    run.phase[k] = ph[k].empty() ? std::nan("") : ph[k][ph[k].size() / 2];
  }
  run.lat = std::move(lat);
  run.engines = d.Engines();
  return run;
}

void Latency(const char* label, const std::string& config,
             std::vector<std::pair<std::string, std::string>> env = {}, int gap_us = 0) {
  const LatencyRun r = MeasureLatency(config, std::move(env), gap_us);
  std::printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f / %.1f / %.1f / %.1f / %.1f / %.1f |\n",
              label, r.p50(), r.p90(), r.lat.front(), r.lat.back(), r.phase[0], r.phase[1],
              r.phase[2], r.phase[3], r.phase[4], r.phase[5]);
  std::printf("  engine: %s\n", r.engines.c_str());
  std::fflush(stdout);
}

// --- cadence -------------------------------------------------------------------------------
// One setting of the cadence table: the daemon's config, the environment (the client's spins),
// the gap between transfers.
struct CadenceSetting {
  std::string label;
  std::string config;
  std::vector<std::pair<std::string, std::string>> env;
  int gap_us;
  bool seen_end = false;  // the end read from the queue (WaitEnd), not the whole status (Wait)
};

// The spins set to cover a 2 ms gap (3 ms each), the daemon's budgets at `budget` percent.
CadenceSetting Covering(std::string label, int budget, std::string extra_config = "") {
  return {std::move(label),
          absl::StrCat("session_submission_spin_us: 3000\ncuda_dispatcher_spin_us: 3000\n",
                       "session_spin_budget_percent: ", budget,
                       "\ncuda_dispatcher_spin_budget_percent: ", budget, "\n", extra_config),
          {{"KVRAIL_SUBMISSION_SPIN_US", "3000"},
           {"KVRAIL_COMPLETION_SPIN_US", "3000"},
           {"KVRAIL_ANSWER_SPIN_US", "3000"}},
          2000};
}

void CadenceRows() {
  std::vector<CadenceSetting> settings = {
      {"default, back to back", "", {}, 0},
      {"default but predictive wake off, 2 ms between transfers",
       "predictive_wake: false\n",
       {},
       2000},
      // Predictive wake at the shipped budgets (session_spin_budget_percent 10,
      // cuda_dispatcher_spin_budget_percent 100) and spins: the poll thread and the dispatcher
      // sleep most of the gap and spin around the next transfer.
      {"2 ms, predictive wake on (shipped budgets and spins)", "predictive_wake: true\n", {}, 2000},
      // The same, and the client spins while its transfer is in flight (not across the gap).
      {"2 ms, predictive wake on, client's in-flight waits spin 300 us",
       "predictive_wake: true\n",
       {{"KVRAIL_SUBMISSION_SPIN_US", "300"}, {"KVRAIL_COMPLETION_SPIN_US", "300"}},
       2000},
      Covering("2 ms, spins cover the gap (3000 us), budgets 100%", 100),
      Covering("2 ms, spins cover the gap, budgets 50%", 50),
      Covering("2 ms, spins cover the gap, budgets 100%, admission on the poll thread "
               "(session_admission_workers: 0)",
               100, "session_admission_workers: 0\n"),
      {"2 ms, the daemon's spins only (budgets 100%, client defaults)",
       "session_submission_spin_us: 3000\ncuda_dispatcher_spin_us: 3000\n"
       "session_spin_budget_percent: 100\n",
       {},
       2000},
  };
  {
    CadenceSetting b2b = Covering("back to back, spins as covering the gap (budgets 100%)", 100);
    b2b.gap_us = 0;
    settings.push_back(std::move(b2b));
  }
  // The end as the client sees it without a call (WaitEnd: the completion queue or the done
  // word; the 4 KiB rows' "seen"), back to back and at the cadence: no phases (the queue's end
  // has no daemon timestamps).
  settings.push_back({"seen (WaitEnd), default, back to back", "", {}, 0, true});
  settings.push_back({"seen (WaitEnd), 2 ms, predictive wake on (shipped budgets and spins)",
                      "predictive_wake: true\n",
                      {},
                      2000,
                      true});
  constexpr int kRuns = 3;
  std::vector<std::vector<LatencyRun>> runs(settings.size());
  for (int run = 0; run < kRuns; ++run) {
    for (size_t i = 0; i < settings.size(); ++i) {
      runs[i].push_back(MeasureLatency(settings[i].config, settings[i].env, settings[i].gap_us,
                                       settings[i].seen_end));
      // As it comes, so a run cut short still leaves what it measured.
      const LatencyRun& r = runs[i].back();
      std::printf(
          "  run %d of %d, %s: p50 %.1f us, p90 %.1f us, kvraild CPU %.1f%%, client %.1f%%\n",
          run + 1, kRuns, settings[i].label.c_str(), r.p50(), r.p90(), r.daemon_cpu_pct,
          r.client_cpu_pct);
      std::fflush(stdout);
    }
  }
  std::printf(
      "\n| setting | p50 | p90 | phases | kvraild CPU %% | client CPU %% |\n"
      "|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < settings.size(); ++i) {
    std::vector<LatencyRun>& r = runs[i];
    auto spread = [&r](const std::function<double(const LatencyRun&)>& f) {
      std::vector<double> v;
      for (const LatencyRun& x : r) v.push_back(f(x));
      return gpu_bench::Cell(gpu_bench::SpreadOf(v));
    };
    // The phases and the engine's line of the run with the median p50.
    std::sort(r.begin(), r.end(),
              [](const LatencyRun& a, const LatencyRun& b) { return a.p50() < b.p50(); });
    const LatencyRun& mid = r[r.size() / 2];
    std::printf("| %s | %s | %s | %.1f / %.1f / %.1f / %.1f / %.1f / %.1f | %s | %s |\n",
                settings[i].label.c_str(),
                spread([](const LatencyRun& x) { return x.p50(); }).c_str(),
                spread([](const LatencyRun& x) { return x.p90(); }).c_str(), mid.phase[0],
                mid.phase[1], mid.phase[2], mid.phase[3], mid.phase[4], mid.phase[5],
                spread([](const LatencyRun& x) { return x.daemon_cpu_pct; }).c_str(),
                spread([](const LatencyRun& x) { return x.client_cpu_pct; }).c_str());
    // The dispatcher's spins from the engine's line (worker_stats.cc), when it spun at all.
    const size_t at = mid.engines.find("idle spin:");
    std::printf("  median run's dispatcher: %s\n",
                at == std::string::npos
                    ? "no idle spin"
                    : mid.engines.substr(at, mid.engines.find(';', at) - at).c_str());
  }
  std::fflush(stdout);
}

// --- doneword -------------------------------------------------------------------------------
// The GPU-written completion: 16 MiB critical transfers (as latency's), submit -> done seen by a
// client polling LocalStates (the completion table: done word, then the queue), p50 of 100 after
// 20 warm-ups, per fresh daemon; with the word (default) and without (KVRAIL_GPU_DONE_WORD=0),
// alternating, 3 runs each; the bytes of the last transfer of each run are checked.
double DoneSeenP50(bool word, uint64_t* hits) {
  ScopedEnv scoped(
      word ? std::vector<std::pair<std::string, std::string>>{}
           : std::vector<std::pair<std::string, std::string>>{{"KVRAIL_GPU_DONE_WORD", "0"}});
  Daemon d("");
  const uint64_t block = 16 << 10;
  const uint32_t pool = 4096, n = 1024;
  const v1::PagedKvLayout layout = BlockLayout(pool, block);
  Pool src = MakePool(d, layout, uint64_t{pool} * block, false);
  Pool dst = MakePool(d, layout, uint64_t{pool} * block, true);
  std::mt19937_64 rng(3);
  const std::vector<uint32_t> from = Scattered(pool, n, rng), to = Scattered(pool, n, rng);
  v1::TransferSpec spec =
      client::MakeBlockTransfer(src.region.region_id(), from, dst.region.region_id(), to);
  spec.set_priority(v1::PRIORITY_CRITICAL);
  std::vector<double> lat;
  const uint64_t hits0 = d.client->DoneWordHits();
  for (int i = 0; i < 120; ++i) {
    const auto t0 = Clock::now();
    const uint64_t id = Must(d.client->Submit(spec), "submit").transfer_id();
    int32_t state = 0;
    while (state < v1::TRANSFER_STATE_SUCCEEDED) d.client->LocalStates(&id, 1, &state);
    const auto t1 = Clock::now();
    if (state != v1::TRANSFER_STATE_SUCCEEDED) {
      std::fprintf(stderr, "FAIL: transfer %llu ended in state %d\n",
                   static_cast<unsigned long long>(id), state);
      std::exit(1);
    }
    if (i >= 20) lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  *hits = d.client->DoneWordHits() - hits0;
  std::vector<uint8_t> landed(uint64_t{pool} * block);
  Check(cudaMemcpy(landed.data(), dst.buffer->data(), landed.size(), cudaMemcpyDeviceToHost),
        "read back");
  for (uint32_t b = 0; b < n; ++b) {
    if (std::memcmp(landed.data() + uint64_t{to[b]} * block,
                    src.host.data() + uint64_t{from[b]} * block, block) != 0) {
      std::fprintf(stderr, "MISMATCH: block %u -> %u\n", from[b], to[b]);
      std::exit(1);
    }
  }
  std::sort(lat.begin(), lat.end());
  return lat[lat.size() / 2];
}

void DoneWordRows() {
  std::vector<double> with, without;
  uint64_t hits_with = 0, hits_without = 0;
  for (int run = 0; run < 3; ++run) {
    uint64_t h = 0;
    with.push_back(DoneSeenP50(true, &h));
    hits_with += h;
    without.push_back(DoneSeenP50(false, &h));
    hits_without += h;
  }
  auto row = [](const char* label, std::vector<double> v, uint64_t hits) {
    std::sort(v.begin(), v.end());
    // Every transfer of the 3 runs counts, the warm-ups too: 3 x 120.
    std::printf("| %s | %.1f | %.1f | %.1f | %llu of 360 |\n", label, v[1], v[0], v[2],
                static_cast<unsigned long long>(hits));
  };
  row("done word (default)", with, hits_with);
  row("without (KVRAIL_GPU_DONE_WORD=0)", without, hits_without);
  std::fflush(stdout);
}

}  // namespace
}  // namespace kvrail

int main(int argc, char** argv) {
  using namespace kvrail;
  g_pair = gpu_bench::TakeGpuPair(&argc, argv);
  const std::string part = argc > 1 ? argv[1] : "all";
  const std::string where_text = g_pair.Name();
  const char* where = where_text.c_str();
  if (part == "all" || part == "split") {
    std::printf(
        "\nsplit: 256 MiB of scattered blocks %s, GB/s median (min-max) of 10, "
        "TransferStatus.engine\n\n| setting | 4 KiB | 32 KiB | 128 KiB |\n|---|---|---|---|\n",
        where);
    SplitRow("kernel only (cuda_copy_split_max_percent 0)", "cuda_copy_split_max_percent: 0");
    SplitRow("learned split (default, max 40%)", "");
    SplitRow("fixed 10%", "cuda_copy_split_fixed_percent: 10");
    SplitRow("fixed 30%", "cuda_copy_split_fixed_percent: 30");
    SplitRow("copy engines only", "cuda_max_ctas: 0\ncuda_copy_only_kernel_ctas: 0");
  }
  if (part == "all" || part == "first") {
    std::printf(
        "\nfirst: 512 MiB of scattered 16 KiB blocks %s, a fresh kvraild per row;"
        " phases in us: client call -> daemon received / accept / reply -> client / "
        "queued (submitted -> first tile started) / running (started -> finished) / "
        "finished -> client's Wait back / wall\n\n"
        "| warm-up | first GB/s | warm GB/s: median (min-max) of 20 | first / warm | first: phases "
        "| "
        "warm medians: phases | warm after the first's idle, median of 5: idle, GB/s | "
        "first / warm after idle | after idle: phases | the same with this process's "
        "GPU work just before (median of 5) GB/s | first / that | that: phases |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        where);
    FirstRow("on (default: CTA knees seeded, dispatcher woken at submit)", "");
    FirstRow("on, cuda_wake_on_submit: false", "cuda_wake_on_submit: false");
    FirstRow("on (again)", "");
    FirstRow("off", "cuda_warm_up: false");
    FirstRow("on (third)", "");
  }
  if (part == "all" || part == "latency") {
    std::printf(
        "\nlatency: 16 MiB critical transfer (1024 x 16 KiB blocks) %s, submit -> "
        "completion seen by the client, 200 after 20 warm-ups (us); phase medians: client "
        "-> daemon / accept / reply / queued / running / finished -> client\n\n"
        "| setting | p50 (median) | p90 | min | max | phases |\n|---|---|---|---|---|---|\n",
        where);
    Latency("default (critical transfers one CTA per SM)", "");
    Latency("critical raise off (cuda_critical_ctas: 0: the 32-CTA budget)",
            "cuda_critical_ctas: 0");
    Latency("default, 2 ms between transfers", "", {}, 2000);
    Latency("cuda_wake_on_submit: false, 2 ms between transfers", "cuda_wake_on_submit: false", {},
            2000);
    Latency("default (again)", "");
    // Each transfer repeats the shape: by default only its block ids are uploaded into the plan
    // kept on the GPU; off, the whole plan is allocated and uploaded per transfer.
    Latency("plans kept warm off (cuda_warm_plans: false)", "cuda_warm_plans: false");
    // Which part of the session path costs what: SUBMITs admitted on the poll thread instead
    // of the admission workers, packets instead of the submission queue, and both.
    Latency("admission on the poll thread (session_admission_workers: 0)",
            "session_admission_workers: 0");
    Latency("packets (KVRAIL_SUBMISSION_QUEUE=0)", "", {{"KVRAIL_SUBMISSION_QUEUE", "0"}});
    Latency("packets, admission on the poll thread", "session_admission_workers: 0",
            {{"KVRAIL_SUBMISSION_QUEUE", "0"}});
    Latency("without the done word (KVRAIL_GPU_DONE_WORD=0)", "", {{"KVRAIL_GPU_DONE_WORD", "0"}});
    Latency("default, 2 ms between transfers (again)", "", {}, 2000);
  }
  if (part == "all" || part == "cadence") {
    std::printf(
        "\ncadence: 16 MiB critical transfer (1024 x 16 KiB blocks) %s, submit -> completion seen "
        "by the client, 200 after 20 warm-ups per fresh kvraild (us), median (min-max) of 3 "
        "runs, settings interleaved; phases (the median run's medians): client -> daemon / "
        "accept / reply / queued / running / finished -> client; CPU over the 200: kvraild's "
        "(/proc/PID/stat utime+stime, every thread, 10 ms ticks) and the client's (getrusage), "
        "percent of one core\n\n",
        where);
    CadenceRows();
  }
  if (part == "all" || part == "doneword") {
    std::printf(
        "\ndoneword: 16 MiB critical transfer (1024 x 16 KiB blocks) %s, submit -> done seen by "
        "a client polling LocalStates, p50 of 100 after 20 warm-ups per fresh kvraild (us); "
        "median (min / max) of 3 runs, alternating\n\n"
        "| setting | p50: median | min | max | ends seen first in the word |\n"
        "|---|---|---|---|---|\n",
        where);
    DoneWordRows();
  }
  return 0;
}
