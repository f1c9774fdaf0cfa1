// The fabric benchmark, one run, one printed table: kvraild A -> kvraild B over libfabric's
// tcp;ofi_rxm provider between two network namespaces joined by a veth pair, against
// `fi_pingpong -p tcp -e rdm` over the same path (client in A's namespace, server in B's, the veth
// addresses), for fabric tiles of 64 KiB, 256 KiB, 1 MiB and 4 MiB; plus one row over loopback
// inside a single namespace (both daemons and both fi_pingpong ends on 127.0.0.1).
//
// kvrail: for each tile size both daemons start with --tile-bytes T and fabric.slot_bytes T (so
// every tile is exactly T: the layout's (layer, part) spans are multiples of 4 MiB), one NIC. A
// paged KV cache (32 layers x K/V x 256 blocks of 16 tokens x 8 heads x 128 bf16 = 512 MiB) moves
// from a host region on A to a host region on B, scattered block tables on both sides. One warm-up
// transfer (then the destination is compared with the source, block by block), then `reps` timed
// transfers: GB/s = bytes / (Submit -> Wait returns), best of `reps`.
// fi_pingpong: message size T, iterations so that about the same bytes move each way; its MB/sec
// column (bytes both ways / time, 1e6), best of `reps` runs. One message is in flight at a time.
//
// With --host-loopback (no root, no iproute2: machines without them, such as the GPU machine):
// every row over loopback in the caller's own network namespace instead, both daemons and both
// fi_pingpong ends on 127.0.0.1, and the target is judged on those rows.
//
// Usage (root): fabric_bench [--mib 512] [--reps 3] [--nics 1] [--no-loopback] [--sizes 65536,...]
//               fabric_bench --host-loopback [--mib ...] [--reps ...] [--sizes ...]
// Namespaces, veth pair and daemons are removed at the end, on failure and on SIGINT/SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/kvrail_client.h"
#include "tests/harness/daemon_process.h"
#include "tests/netns/netns.h"

extern char** environ;

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;
using testing::NetnsPair;
using testing::NsDaemon;
using testing::NsDaemonOptions;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string LoadAvg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string Size(uint64_t bytes) {
  if (bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

// What a signal handler must clean up: the namespaces (and so the veth pair) and the daemons.
NetnsPair* g_net = nullptr;
std::vector<pid_t> g_children;

void OnSignal(int sig) {
  for (pid_t p : g_children) {
    if (p > 0) kill(p, SIGKILL);
  }
  if (g_net != nullptr) {
    // Not async-signal-safe, but this process is about to exit anyway.
    testing::Sh("ip netns del " + g_net->ns_a);
    testing::Sh("ip netns del " + g_net->ns_b);
  }
  _exit(128 + sig);
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& out) {
  std::vector<char*> argv;
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  g_children.push_back(pid);
  return pid;
}

// Waits up to `timeout_s`; kills it after that. Returns the exit status or -1.
int WaitChild(pid_t pid, double timeout_s) {
  const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return -1;
    if (Clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      status = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  g_children.erase(std::remove(g_children.begin(), g_children.end(), pid), g_children.end());
  return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// One fi_pingpong run (server in `server_ns`, client in `client_ns` connecting to `server_ip`);
// its MB/sec column in GB/s, or a negative value (and `error`) when it did not run.
double PingPongOnce(const std::string& server_ns, const std::string& client_ns,
                    const std::string& server_ip, uint64_t size, uint64_t iters,
                    const std::string& dir, std::string* error) {
  const std::vector<std::string> common = {
      "-p", "tcp", "-e", "rdm", "-S", std::to_string(size), "-I", std::to_string(iters)};
  for (int attempt = 0; attempt < 3; ++attempt) {
    // An empty namespace: the caller's own.
    const auto in = [](const std::string& ns) {
      return ns.empty() ? std::vector<std::string>{"fi_pingpong"}
                        : std::vector<std::string>{"ip", "netns", "exec", ns, "fi_pingpong"};
    };
    std::vector<std::string> server = in(server_ns);
    server.insert(server.end(), common.begin(), common.end());
    std::vector<std::string> client = in(client_ns);
    client.insert(client.end(), common.begin(), common.end());
    client.push_back(server_ip);
    const pid_t s = Spawn(server, dir + "/pp_server.txt");
    if (s < 0) {
      *error = "cannot spawn fi_pingpong";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(400 + 400 * attempt));
    const pid_t c = Spawn(client, dir + "/pp_client.txt");
    const int crc = c < 0 ? -1 : WaitChild(c, 120);
    WaitChild(s, crc == 0 ? 10 : 0.5);
    const std::string out = ReadFile(dir + "/pp_client.txt");
    if (crc != 0) {
      *error = "fi_pingpong client exit " + std::to_string(crc) + ": " + out.substr(0, 300);
      continue;
    }
    // "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec", then one line per size.
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::vector<std::string> w;
      for (std::string x; words >> x;) w.push_back(x);
      if (w.size() >= 8 && w[0] != "bytes") return std::atof(w[5].c_str()) / 1000.0;
    }
    *error = "unparsed fi_pingpong output: " + out.substr(0, 300);
    return -1;
  }
  return -1;
}

double PingPong(const std::string& server_ns, const std::string& client_ns,
                const std::string& server_ip, uint64_t size, uint64_t bytes_each_way, int reps,
                const std::string& dir, std::string* error) {
  const uint64_t iters = std::max<uint64_t>(100, bytes_each_way / size);
  double best = -1;
  for (int r = 0; r < reps; ++r) {
    best = std::max(best, PingPongOnce(server_ns, client_ns, server_ip, size, iters, dir, error));
  }
  return best;
}

struct KvResult {
  double best_gbps = -1, median_gbps = -1;
  uint32_t tiles = 0;
  uint64_t bytes = 0;
  std::string error;
};

// kvraild A (ns_a, ip_a) -> kvraild B (ns_b, ip_b) with tiles of exactly `tile` bytes.
KvResult KvRail(const std::string& ns_a, const std::string& ip_a, int port_a,
                const std::string& ns_b, const std::string& ip_b, int port_b, uint64_t tile,
                uint32_t layers, int reps, int nics) {
  KvResult result;
  NsDaemonOptions oa;
  oa.nics = nics;
  oa.tile_bytes = tile;
  oa.slot_bytes = tile;
  // At least 16 slots (the default), and up to 64 so that small tiles keep >= 4 MiB in flight.
  oa.slots = static_cast<uint32_t>(std::clamp<uint64_t>((16u << 20) / tile, 16, 64));
  oa.log_level = "warn";
  NsDaemonOptions ob = oa;
  oa.port = port_a;
  oa.peer_port = port_b;
  ob.port = port_b;
  ob.peer_port = port_a;
  // Declared before the daemons, so it runs after their destructors have stopped them.
  struct Forget {
    std::vector<pid_t> pids;
    ~Forget() {
      for (pid_t p : pids) {
        g_children.erase(std::remove(g_children.begin(), g_children.end(), p), g_children.end());
      }
    }
  } forget;
  NsDaemon a, b;
  const bool started = a.Start(ns_a, "a", ip_a, "b", ip_b, oa);
  g_children.push_back(a.pid);
  const bool started_b = started && b.Start(ns_b, "b", ip_b, "a", ip_a, ob);
  g_children.push_back(b.pid);
  forget.pids = {a.pid, b.pid};
  auto fail = [&](const std::string& what) {
    result.error = what + "\n--- a log:\n" + a.Log().substr(0, 2000) + "\n--- b log:\n" +
                   b.Log().substr(0, 2000);
    return result;
  };
  if (!started || !started_b) return fail("a daemon did not start");

  // 32 layers x 2 parts x 256 blocks x 32 KiB (16 tokens x 8 heads x 128 x bf16) = 512 MiB.
  constexpr uint32_t kBlocks = 256;
  const auto layout = testing::MakeLayout(layers, 2, kBlocks, 16, 8, 128, v1::DTYPE_BF16,
                                          v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const uint64_t bytes = testing::LayoutBytes(layout);
  auto src = a.client->CreateHostBuffer(bytes);
  auto dst = b.client->CreateHostBuffer(bytes);
  if (!src.ok() || !dst.ok()) return fail("CreateHostBuffer failed");
  // Distinct contents per 8 bytes (so a misplaced chunk shows); every page touched.
  {
    uint64_t* p = reinterpret_cast<uint64_t*>((*src)->data());
    for (uint64_t i = 0; i < bytes / 8; ++i) p[i] = i * 0x9E3779B97F4A7C15ull;
    std::memset((*dst)->data(), 0, bytes);
  }
  auto spec_of = [&](bool writable) {
    v1::RegionSpec spec;
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(bytes);
    spec.set_writable(writable);
    *spec.mutable_paged_kv() = layout;
    return spec;
  };
  auto src_info = a.client->RegisterHostBuffer(**src, spec_of(false));
  auto dst_info = b.client->RegisterHostBuffer(**dst, spec_of(true));
  if (!src_info.ok() || !dst_info.ok()) return fail("RegisterHostBuffer failed");
  if (auto s = b.Export(dst_info->region_id(), "a"); !s.ok()) return fail(s.ToString());

  std::vector<uint32_t> src_blocks(kBlocks), dst_blocks(kBlocks);
  std::iota(src_blocks.begin(), src_blocks.end(), 0);
  std::iota(dst_blocks.begin(), dst_blocks.end(), 0);
  std::mt19937 rng(5);
  std::shuffle(src_blocks.begin(), src_blocks.end(), rng);
  std::shuffle(dst_blocks.begin(), dst_blocks.end(), rng);
  auto spec = client::MakeBlockTransfer(src_info->region_id(), src_blocks, dst_info->region_id(),
                                        dst_blocks);
  spec.mutable_dst()->set_node_id("b");
  spec.mutable_dst()->set_grant(b.WriteGrant(dst_info->region_id()));
  spec.set_timeout_ms(300000);

  std::vector<double> gbps;
  for (int r = 0; r <= reps; ++r) {  // r == 0: warm-up
    const auto t0 = Clock::now();
    auto submitted = a.client->Submit(spec);
    if (!submitted.ok()) return fail("Submit: " + submitted.status().ToString());
    auto status = a.client->Wait(submitted->transfer_id());
    const double s = Seconds(Clock::now() - t0);
    if (!status.ok()) return fail("Wait: " + status.status().ToString());
    if (status->state() != v1::TRANSFER_STATE_SUCCEEDED || status->path() != v1::PATH_FABRIC) {
      return fail("transfer did not succeed over the fabric: " + status->DebugString());
    }
    result.tiles = status->tiles_total();
    result.bytes = status->bytes_total();
    if (r == 0) {
      // The destination holds the source's blocks, permuted (every chunk compared).
      const uint64_t chunk = 16 * 8 * 128 * 2;
      for (uint32_t layer = 0; layer < layers; ++layer)
        for (uint32_t part = 0; part < 2; ++part)
          for (uint32_t i = 0; i < kBlocks; ++i) {
            const uint8_t* from =
                (*src)->data() + testing::ElementOffset(layout, layer, part, src_blocks[i], 0, 0);
            const uint8_t* to =
                (*dst)->data() + testing::ElementOffset(layout, layer, part, dst_blocks[i], 0, 0);
            if (std::memcmp(from, to, chunk) != 0) {
              return fail("destination differs from source at layer " + std::to_string(layer) +
                          " part " + std::to_string(part) + " block " + std::to_string(i));
            }
          }
      continue;
    }
    gbps.push_back(static_cast<double>(result.bytes) / s / 1e9);
  }
  std::sort(gbps.begin(), gbps.end());
  result.best_gbps = gbps.back();
  result.median_gbps = gbps[gbps.size() / 2];
  return result;
}

struct Row {
  std::string path;
  uint64_t tile;
  KvResult kv;
  double pp = -1;
  std::string pp_error;
};

// The table, the target line (judged on rows of `primary` path) and failures; returns how many
// cells failed.
int PrintRows(const std::vector<Row>& rows, const std::string& primary, Clock::time_point t_start) {
  double pp_best = -1, kv_best = -1;
  for (const Row& r : rows) {
    if (r.path != primary) continue;
    pp_best = std::max(pp_best, r.pp);
    kv_best = std::max(kv_best, r.kv.best_gbps);
  }
  std::printf(
      "\n| path | tile / message | tiles | kvrail A→B GB/s best (median) | "
      "fi_pingpong GB/s best | kvrail / fi_pingpong | kvrail / fi_pingpong best (%s) |\n"
      "|---|---|---|---|---|---|---|\n",
      primary.c_str());
  for (const Row& r : rows) {
    char kv[64] = "failed", pp[32] = "failed", ratio[32] = "-", ratio_best[32] = "-";
    if (r.kv.best_gbps > 0) {
      std::snprintf(kv, sizeof(kv), "%.2f (%.2f)", r.kv.best_gbps, r.kv.median_gbps);
    }
    if (r.pp > 0) std::snprintf(pp, sizeof(pp), "%.2f", r.pp);
    if (r.kv.best_gbps > 0 && r.pp > 0) {
      std::snprintf(ratio, sizeof(ratio), "%.0f%%", 100 * r.kv.best_gbps / r.pp);
    }
    if (r.kv.best_gbps > 0 && pp_best > 0 && r.path == primary) {
      std::snprintf(ratio_best, sizeof(ratio_best), "%.0f%%", 100 * r.kv.best_gbps / pp_best);
    }
    std::printf("| %s | %s | %u | %s | %s | %s | %s |\n", r.path.c_str(), Size(r.tile).c_str(),
                r.kv.tiles, kv, pp, ratio, ratio_best);
  }
  std::printf(
      "\n%s: kvrail best %.2f GB/s, fi_pingpong best %.2f GB/s: %.0f%% (target >= 90%%: "
      "%s)\n",
      primary.c_str(), kv_best, pp_best, pp_best > 0 ? 100 * kv_best / pp_best : 0.0,
      pp_best > 0 && kv_best >= 0.9 * pp_best ? "met" : "NOT met");
  std::printf("load average after: %s; %.0f s in all\n", LoadAvg().c_str(),
              Seconds(Clock::now() - t_start));
  int failures = 0;
  for (const Row& r : rows) {
    if (!r.kv.error.empty()) {
      ++failures;
      std::fprintf(stderr, "\n%s %s kvrail: %s\n", r.path.c_str(), Size(r.tile).c_str(),
                   r.kv.error.c_str());
    }
    if (r.pp < 0) {
      ++failures;
      std::fprintf(stderr, "\n%s %s fi_pingpong: %s\n", r.path.c_str(), Size(r.tile).c_str(),
                   r.pp_error.c_str());
    }
  }
  return failures;
}

// --host-loopback: every size over 127.0.0.1 in this namespace.
int HostLoopback(const std::vector<uint64_t>& sizes, uint32_t layers, int reps, int nics) {
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  const auto t_start = Clock::now();
  testing::TempDir dir;
  std::printf(
      "loopback in this namespace (127.0.0.1); %u layers, %llu MiB per transfer, best of "
      "%d after a warm-up; %d fabric endpoint(s) per daemon; %u CPUs; load average "
      "before: %s\n",
      layers, static_cast<unsigned long long>(layers * 16ull), reps, nics,
      std::thread::hardware_concurrency(), LoadAvg().c_str());
  std::fflush(stdout);
  std::vector<Row> rows;
  int port = 7270;
  for (uint64_t tile : sizes) {
    Row row{"loopback", tile};
    row.kv = KvRail("", "127.0.0.1", port, "", "127.0.0.1", port + 1, tile, layers, reps, nics);
    port += 2;
    row.pp = PingPong("", "", "127.0.0.1", tile, layers * (16ull << 20), reps, dir.path(),
                      &row.pp_error);
    std::fprintf(stderr, "  loopback %s: kvrail %.3f GB/s, fi_pingpong %.3f GB/s %s\n",
                 Size(tile).c_str(), row.kv.best_gbps, row.pp, row.kv.error.c_str());
    rows.push_back(row);
  }
  return PrintRows(rows, "loopback", t_start) == 0 ? 0 : 1;
}

int Main(int argc, char** argv) {
  uint64_t mib = 512;
  int reps = 3;
  bool loopback = true;
  bool host_loopback = false;
  int nics = 1;  // fabric endpoints per daemon on the one path (striping over one link)
  std::vector<uint64_t> sizes = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mib" && i + 1 < argc) {
      mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--nics" && i + 1 < argc) {
      nics = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--no-loopback") {
      loopback = false;
    } else if (arg == "--host-loopback") {
      host_loopback = true;
    } else if (arg == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::istringstream in(argv[++i]);
      for (std::string s; std::getline(in, s, ',');)
        sizes.push_back(std::strtoull(s.c_str(), 0, 10));
    } else {
      std::fprintf(stderr,
                   "usage: fabric_bench [--mib 512] [--reps 3] [--nics 1] [--no-loopback | "
                   "--host-loopback] [--sizes a,b]\n");
      return 2;
    }
  }
  // 16 MiB per layer (2 parts x 8 MiB): every (layer, part) span is a multiple of 4 MiB.
  const uint32_t layers = static_cast<uint32_t>(std::max<uint64_t>(1, mib / 16));
  for (uint64_t s : sizes) {
    if (s == 0 || (8ull << 20) % s != 0 || s % (32 << 10) != 0) {
      std::fprintf(stderr, "tile size %llu must divide 8 MiB and be a multiple of 32 KiB\n",
                   static_cast<unsigned long long>(s));
      return 2;
    }
  }
  if (host_loopback) return HostLoopback(sizes, layers, reps, nics);
  if (const std::string why = testing::CannotMakeNamespaces(); !why.empty()) {
    std::fprintf(stderr, "fabric_bench needs root: %s\n", why.c_str());
    return 1;
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGHUP, OnSignal);

  const std::string load_before = LoadAvg();
  const auto t_start = Clock::now();
  testing::TempDir dir;
  NetnsPair net;
  g_net = &net;
  if (!net.ok) {
    std::fprintf(stderr, "could not create namespaces %s/%s and veth %s/%s\n", net.ns_a.c_str(),
                 net.ns_b.c_str(), net.veth_a.c_str(), net.veth_b.c_str());
    return 1;
  }
  std::printf(
      "namespaces %s (%s) <-veth-> %s (%s); %u layers, %llu MiB per transfer, best of %d "
      "after a warm-up; %d fabric endpoint(s) per daemon; load average before: %s\n",
      net.ns_a.c_str(), net.ip_a.c_str(), net.ns_b.c_str(), net.ip_b.c_str(), layers,
      static_cast<unsigned long long>(layers * 16ull), reps, nics, load_before.c_str());
  std::fflush(stdout);

  std::vector<Row> rows;
  int port = 7070;
  for (uint64_t tile : sizes) {
    Row row{"veth", tile};
    row.kv = KvRail(net.ns_a, net.ip_a, port, net.ns_b, net.ip_b, port, tile, layers, reps, nics);
    ++port;  // a fresh port per pair of daemons (no TIME_WAIT surprises)
    row.pp = PingPong(net.ns_b, net.ns_a, net.ip_b, tile, layers * (16ull << 20), reps, dir.path(),
                      &row.pp_error);
    std::fprintf(stderr, "  veth %s: kvrail %.3f GB/s, fi_pingpong %.3f GB/s %s\n",
                 Size(tile).c_str(), row.kv.best_gbps, row.pp, row.kv.error.c_str());
    rows.push_back(row);
  }
  if (loopback) {
    const uint64_t tile = 1 << 20;
    Row row{"loopback", tile};
    row.kv =
        KvRail(net.ns_a, "127.0.0.1", 7170, net.ns_a, "127.0.0.1", 7171, tile, layers, reps, nics);
    row.pp = PingPong(net.ns_a, net.ns_a, "127.0.0.1", tile, layers * (16ull << 20), reps,
                      dir.path(), &row.pp_error);
    std::fprintf(stderr, "  loopback %s: kvrail %.3f GB/s, fi_pingpong %.3f GB/s %s\n",
                 Size(tile).c_str(), row.kv.best_gbps, row.pp, row.kv.error.c_str());
    rows.push_back(row);
  }

  const int failures = PrintRows(rows, "veth", t_start);
  g_net = nullptr;
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvrail::bench

int main(int argc, char** argv) { return kvrail::bench::Main(argc, argv); }
