// Floods beside checksummed tenants, against a real kvraild (host engine, a temporary socket):
// one uid (the flooder, tests/load/flooder.cc, run as uid 65534) holds everything the caps let
// it hold - sessions, fd tokens, session WAITs, watch streams, notification watches and polls -
// and storms CreateGrant, oversized shared block tables and ListTransfers / GetTransfer probing,
// while 8 clients (tests/load/checksum_worker.h) run checksummed transfers.
//
// Each round runs the clients unloaded, then again with the floods in place. Asserted: 0 verify
// failures; each flood refused by its cap, naming it; no answer to the flooder showing another
// session's transfer; the daemon's threads, descriptors and RSS within bounds while flooded and
// back near the baseline after the flooder exits. Printed: per tenant, p50 and p99 of plain
// transfers (submit to end) unloaded and flooded, and the p99 ratio (median and min/max over
// the rounds); the daemon's threads, fds and RSS before, during (the most seen) and after.
// Latencies are printed, not asserted (a timing; docs/benchmarks.md "Floods" has the figures).
//
// Size from the environment (BUILD): KVRAIL_FLOOD_CLIENTS (8), KVRAIL_FLOOD_OPS (operations per
// client per phase, 150), KVRAIL_FLOOD_ROUNDS (1). Needs root (the flooder is another uid).
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/proc_status.h"
#include "tests/load/checksum_worker.h"

namespace kvrail::testing {
namespace {

constexpr uid_t kFlooderUid = 65534;

uint64_t OpenFds(pid_t pid) {
  uint64_t n = 0;
  DIR* dir = ::opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return 0;
  while (dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
  ::closedir(dir);
  return n;
}

// The daemon's threads, descriptors and VmRSS (KiB).
struct Usage {
  uint64_t threads = 0, fds = 0, rss_kib = 0;
  static Usage Of(pid_t pid) {
    return {ProcStatusField(pid, "Threads"), OpenFds(pid), VmRssKib(pid)};
  }
  void Max(const Usage& o) {
    threads = std::max(threads, o.threads);
    fds = std::max(fds, o.fds);
    rss_kib = std::max(rss_kib, o.rss_kib);
  }
  std::string Row() const {
    return absl::StrFormat("%3d threads, %5d fds, %4.0f MiB RSS", threads, fds, rss_kib / 1024.0);
  }
};

absl::Duration Percentile(std::vector<absl::Duration> v, double p) {
  if (v.empty()) return absl::ZeroDuration();
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(v.size() * p))];
}

// The flooder as uid 65534 (in the socket's group): its stdout is read line by line, and closing
// its stdin ends it.
class FlooderProcess {
 public:
  bool Start(const std::string& binary, const std::string& socket) {
    struct stat socket_stat {};
    if (::stat(socket.c_str(), &socket_stat) != 0) return false;
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return false;
    std::vector<std::string> args = {binary, "--socket", socket};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const gid_t group = socket_stat.st_gid;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      if (::setgroups(1, &group) != 0 || ::setgid(kFlooderUid) != 0 || ::setuid(kFlooderUid) != 0) {
        ::_exit(126);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = ::fdopen(out[0], "r");
    return pid_ > 0 && stdout_ != nullptr;
  }
  // Reads "<key> <value>" lines into `said` until `marker` (true) or the end of output (false).
  bool ReadUntil(const std::string& marker) {
    char* line = nullptr;
    size_t size = 0;
    bool found = false;
    while (::getline(&line, &size, stdout_) > 0) {
      std::string text(line);
      if (!text.empty() && text.back() == '\n') text.pop_back();
      const size_t space = text.find(' ');
      const std::string key = text.substr(0, space);
      if (key == marker) {
        found = true;
        break;
      }
      said[key] = space == std::string::npos ? "" : text.substr(space + 1);
    }
    std::free(line);
    return found;
  }
  // Closes its stdin, reads its last lines and waits; the exit status (-1: killed).
  int Stop() {
    if (stdin_ >= 0) ::close(std::exchange(stdin_, -1));
    if (!ReadUntil("END")) WARN("the flooder ended without END");
    std::fclose(std::exchange(stdout_, nullptr));
    int status = 0;
    ::waitpid(std::exchange(pid_, -1), &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~FlooderProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdin_ >= 0) ::close(stdin_);
    if (stdout_ != nullptr) std::fclose(stdout_);
  }
  std::map<std::string, std::string> said;

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  FILE* stdout_ = nullptr;
};

uint64_t Number(const std::map<std::string, std::string>& said, const std::string& key) {
  auto it = said.find(key);
  return it == said.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

bool Names(const std::map<std::string, std::string>& said, const std::string& key,
           const std::string& text) {
  auto it = said.find(key);
  INFO(key << ": " << (it == said.end() ? "(not said)" : it->second));
  return it != said.end() && absl::StrContains(it->second, text);
}

struct Round {
  std::vector<absl::Duration> p50_quiet, p99_quiet, p50_flood, p99_flood;  // per tenant
  Usage before, during, after;
  std::map<std::string, std::string> flooder;
};

std::string Ms(absl::Duration d) { return absl::StrFormat("%.2f", absl::ToDoubleMilliseconds(d)); }

// "median [min-max]" of one tenant's figure over the rounds.
std::string Spread(std::vector<double> v, const char* format) {
  std::sort(v.begin(), v.end());
  return absl::StrCat(absl::StrFormat(format, v[v.size() / 2]), " [",
                      absl::StrFormat(format, v.front()), "-", absl::StrFormat(format, v.back()),
                      "]");
}

TEST_CASE(
    "floods of one uid beside 8 checksummed tenants: 0 verify failures, every flood "
    "capped, daemon threads, fds and RSS bounded") {
  REQUIRE(::geteuid() == 0);  // the flooder runs as another uid (CI runs as root)
  const uint32_t clients = EnvOr("KVRAIL_FLOOD_CLIENTS", 8);
  const uint64_t ops = EnvOr("KVRAIL_FLOOD_OPS", 150);
  const uint64_t rounds = EnvOr("KVRAIL_FLOOD_ROUNDS", 1);
  TempDir dir;
  REQUIRE(::chmod(dir.path().c_str(), 0711) == 0);  // the flooder reaches the sockets inside
  // The flooder where uid 65534 may run it (the runfiles are under root's home).
  TempDir bin;
  REQUIRE(::chmod(bin.path().c_str(), 0755) == 0);
  const std::string flooder_binary = bin.path() + "/flooder";
  std::filesystem::copy_file(RunfilePath("tests/load/flooder"), flooder_binary);
  REQUIRE(::chmod(flooder_binary.c_str(), 0755) == 0);
  const std::string config = dir.path() + "/kvraild.conf";
  std::ofstream(config) << "transfer_history: 256\n";
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path(), {"--config", config, "--tile-bytes", "16384"}));
  const pid_t pid = daemon.pid();

  std::vector<std::unique_ptr<ChecksumWorker>> workers;
  for (uint32_t i = 0; i < clients; ++i) {
    workers.push_back(ChecksumWorker::Create(daemon.socket(), i));
    REQUIRE(workers.back()->Setup());
  }
  // One phase of every client's `ops`; each tenant's p50 and p99.
  auto phase = [&](std::vector<absl::Duration>* p50, std::vector<absl::Duration>* p99) {
    std::atomic<uint64_t> done{0};
    std::vector<std::thread> threads;
    for (auto& w : workers) threads.emplace_back([&, w = w.get()] { w->Run(ops, &done); });
    for (auto& t : threads) t.join();
    for (auto& w : workers) {
      const std::vector<absl::Duration> latencies = w->TakeLatencies();
      p50->push_back(Percentile(latencies, 0.50));
      p99->push_back(Percentile(latencies, 0.99));
    }
  };
  // A warm-up phase, not counted.
  {
    std::vector<absl::Duration> unused50, unused99;
    phase(&unused50, &unused99);
  }

  std::vector<Round> results;
  for (uint64_t r = 0; r < rounds; ++r) {
    Round round;
    phase(&round.p50_quiet, &round.p99_quiet);
    round.before = Usage::Of(pid);
    FlooderProcess flooder;
    REQUIRE(flooder.Start(flooder_binary, daemon.socket()));
    const bool up = flooder.ReadUntil("UP");
    if (!up) {
      INFO("flooder said: " << flooder.said.size() << " lines");
      REQUIRE(flooder.Stop() == 0);
    }
    REQUIRE(up);
    round.during = Usage::Of(pid);
    std::atomic<bool> sampling{true};
    std::thread sampler([&] {
      while (sampling.load()) {
        round.during.Max(Usage::Of(pid));
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
    phase(&round.p50_flood, &round.p99_flood);
    sampling = false;
    sampler.join();
    CHECK(flooder.Stop() == 0);
    round.flooder = flooder.said;
    // The daemon sees the flooder's connections close in its own time: up to 10 s.
    const absl::Time settle_by = absl::Now() + absl::Seconds(10);
    do {
      round.after = Usage::Of(pid);
      if (round.after.fds <= round.before.fds + 8) break;
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < settle_by);
    results.push_back(std::move(round));
  }

  // The table: per tenant, the median [min-max] over the rounds.
  std::string table = absl::StrCat(
      clients, " tenants x ", ops, " operations per phase, ", rounds,
      " round(s); plain transfers' submit-to-end ms, median [min-max] over rounds\n",
      "tenant | unloaded p50 | unloaded p99 | flooded p50 | flooded p99 | p99 flooded/unloaded\n");
  for (uint32_t t = 0; t < clients; ++t) {
    std::vector<double> q50, q99, f50, f99, ratio;
    for (const Round& r : results) {
      q50.push_back(absl::ToDoubleMilliseconds(r.p50_quiet[t]));
      q99.push_back(absl::ToDoubleMilliseconds(r.p99_quiet[t]));
      f50.push_back(absl::ToDoubleMilliseconds(r.p50_flood[t]));
      f99.push_back(absl::ToDoubleMilliseconds(r.p99_flood[t]));
      ratio.push_back(r.p99_quiet[t] > absl::ZeroDuration()
                          ? absl::FDivDuration(r.p99_flood[t], r.p99_quiet[t])
                          : 0.0);
    }
    absl::StrAppend(&table, t, " | ", Spread(q50, "%.2f"), " | ", Spread(q99, "%.2f"), " | ",
                    Spread(f50, "%.2f"), " | ", Spread(f99, "%.2f"), " | ", Spread(ratio, "%.2f"),
                    "\n");
  }
  for (size_t r = 0; r < results.size(); ++r) {
    const Round& round = results[r];
    absl::StrAppend(&table, "round ", r, " daemon: before ", round.before.Row(), "; flooded (max) ",
                    round.during.Row(), "; after ", round.after.Row(), "\n");
  }
  const auto& said = results.front().flooder;
  for (const auto& [key, value] : said)
    absl::StrAppend(&table, "  flooder ", key, ": ", value, "\n");
  WARN(table);

  Tally total;
  for (auto& w : workers) {
    w->CheckSourceUntouched();
    total.succeeded += w->tally().succeeded;
    total.errors.insert(total.errors.end(), w->tally().errors.begin(), w->tally().errors.end());
  }
  for (const std::string& e : total.errors) FAIL_CHECK(e);
  CHECK(total.errors.empty());  // 0 verify failures, unloaded and flooded
  CHECK(total.succeeded > clients * ops / 3);

  for (const Round& round : results) {
    const auto& f = round.flooder;
    // Each held flood stopped at its cap, which its refusal names.
    CHECK(Names(f, "session_refusal", "max_sessions_per_uid"));
    CHECK(Names(f, "fd_refusal", "max_fd_tokens_per_uid"));
    CHECK(Names(f, "wait_refusal_connection", "max_watchers_per_session"));
    CHECK(Names(f, "wait_refusal_uid", "max_watchers_per_uid"));
    CHECK(Number(f, "waits_pending") == 1024);
    CHECK(Names(f, "watch_refusal_session", "max_watchers_per_session"));
    CHECK(Names(f, "watch_refusal_uid", "max_watchers_per_uid"));
    CHECK(Number(f, "notification_polls_waiting") >= 31 * 14);
    // The storms were refused too, and quickly; nothing showed another session's transfer.
    CHECK(Number(f, "grants_created") > 0);
    if (Number(f, "grants_refused") > 0)
      CHECK(Names(f, "grant_refusal", "grants: the session holds"));
    CHECK(Names(f, "table_refusal", "block_table"));
    CHECK(Number(f, "tables_refused") > 0);
    CHECK(Number(f, "probes") > 0);
    CHECK(Number(f, "leaks") == 0);
    CHECK(Number(f, "waits_refused") > 0);
    // Bounded: no thread per session, wait, watch or poll (a thousand of each are open); a
    // descriptor per fd token held and per session connection; memory by a margin.
    const uint64_t held = Number(f, "fd_tokens") + Number(f, "sessions") * 2;
    CHECK(round.during.threads <= round.before.threads + 24);
    CHECK(round.during.fds <= round.before.fds + held + 64);
    CHECK(round.during.rss_kib <= round.before.rss_kib + 256 * 1024);
    // Everything the flooder held goes with it.
    CHECK(round.after.threads <= round.before.threads + 8);
    CHECK(round.after.fds <= round.before.fds + 8);
    CHECK(round.after.rss_kib <= round.before.rss_kib + EnvOr("KVRAIL_LOAD_RSS_MIB", 64) * 1024);
  }
  for (auto& w : workers) w->Close();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail::testing
