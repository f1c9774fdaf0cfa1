#include "tools/kvrail/cli_top.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tools/kvrail/cli_format.h"

namespace kvrail::client::cli {
namespace {

struct Frame {
  v1::Stats stats;
  std::map<std::string, double> gbps_by_path;      // path name -> GB/s over the last interval
  std::map<std::string, int> transfers_by_path;    // active transfers per path
  std::vector<std::pair<double, v1::TransferStatus>> busiest;  // (GB/s, status)
};

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

void Print(const Frame& f, bool json, bool tty) {
  const v1::Stats& s = f.stats;
  if (json) {
    std::string paths;
    for (const auto& [path, gbps] : f.gbps_by_path) {
      absl::StrAppend(&paths, paths.empty() ? "" : ",", "\"", path, "\":", absl::StrFormat("%.3f", gbps));
    }
    std::string queued;
    for (const auto& [cls, n] : s.queued_tiles()) {
      absl::StrAppend(&queued, queued.empty() ? "" : ",", "\"", cls, "\":", n);
    }
    std::string engines;
    for (const auto& e : s.engines()) {
      absl::StrAppend(&engines, engines.empty() ? "" : ",", "\"", JsonEscape(e), "\"");
    }
    std::cout << "{\"gbps_by_path\":{" << paths << "},\"queued_tiles\":{" << queued
              << "},\"transfers_active\":" << s.transfers_active() << ",\"engines\":[" << engines
              << "]}" << std::endl;
    return;
  }
  std::string out = tty ? "\x1b[H\x1b[2J" : "";
  absl::StrAppend(&out, "kvraild ", s.version(), " on ", s.node_id(), "   regions ", s.regions(),
                  "   active ", s.transfers_active(), "   moved ", HumanBytes(s.bytes_moved()),
                  s.draining() ? "   DRAINING" : "", "\n\n");
  absl::StrAppend(&out, absl::StrFormat("%-28s %10s %10s\n", "PATH / LINK", "GB/s", "ACTIVE"));
  if (f.gbps_by_path.empty()) absl::StrAppend(&out, "(idle)\n");
  for (const auto& [path, gbps] : f.gbps_by_path) {
    auto it = f.transfers_by_path.find(path);
    absl::StrAppend(&out, absl::StrFormat("%-28s %10.2f %10d\n", path, gbps,
                                          it == f.transfers_by_path.end() ? 0 : it->second));
  }
  absl::StrAppend(&out, "\nQUEUED TILES ");
  for (const char* cls : {"critical", "normal", "background"}) {
    auto it = s.queued_tiles().find(cls);
    absl::StrAppend(&out, "  ", cls, " ", it == s.queued_tiles().end() ? 0 : it->second);
  }
  absl::StrAppend(&out, "\n\nENGINES\n");
  for (const auto& e : s.engines()) absl::StrAppend(&out, "  ", e, "\n");
  absl::StrAppend(&out, "\n", absl::StrFormat("%-18s %-10s %-12s %-22s %8s\n", "TRANSFER", "PRIO",
                                             "PATH", "DONE", "GB/s"));
  for (const auto& [gbps, t] : f.busiest) {
    absl::StrAppend(&out, absl::StrFormat("%-18d %-10s %-12s %-22s %8.2f\n", t.transfer_id(),
                                          PriorityName(t.spec().priority()), PathName(t.path()),
                                          HumanBytes(t.bytes_done()) + "/" + HumanBytes(t.bytes_total()),
                                          gbps));
  }
  std::cout << out << std::flush;
}

}  // namespace

int RunTop(Client& client, bool json, uint32_t interval_ms, uint32_t iterations) {
  const bool tty = !json && ::isatty(STDOUT_FILENO) == 1;
  if (interval_ms == 0) interval_ms = 1000;
  absl::flat_hash_map<uint64_t, uint64_t> last_bytes;
  absl::Time last = absl::Now();
  bool first = true;
  for (uint32_t i = 0; iterations == 0 || i < iterations; ++i) {
    if (!first) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    Frame f;
    auto stats = client.GetStats();
    auto transfers = client.ListTransfers({}, 500);
    if (!stats.ok() || !transfers.ok()) {
      std::cerr << "kvrail: " << (stats.ok() ? transfers.status() : stats.status()).ToString() << "\n";
      return 1;
    }
    const absl::Time now = absl::Now();
    const double dt = std::max(1e-3, absl::ToDoubleSeconds(now - last));
    f.stats = *std::move(stats);
    absl::flat_hash_map<uint64_t, uint64_t> seen;
    for (const v1::TransferStatus& t : transfers->transfers()) {
      seen[t.transfer_id()] = t.bytes_done();
      const bool active = t.state() == v1::TRANSFER_STATE_QUEUED || t.state() == v1::TRANSFER_STATE_RUNNING;
      auto prev = last_bytes.find(t.transfer_id());
      // Transfers first seen count from zero only when they started within the interval.
      const uint64_t before = prev != last_bytes.end() ? prev->second : (first ? t.bytes_done() : 0);
      const double gbps = static_cast<double>(t.bytes_done() - std::min(before, t.bytes_done())) / dt / 1e9;
      // One row per path and link ("nvlink_p2p gpu0-gpu1", "fabric" with its NICs).
      std::string key = PathName(t.path());
      if (!t.link().empty()) absl::StrAppend(&key, " ", t.link());
      for (const std::string& nic : t.nics()) absl::StrAppend(&key, " ", nic);
      if (gbps > 0 || active) f.gbps_by_path[key] += gbps;
      if (active) {
        ++f.transfers_by_path[key];
        f.busiest.emplace_back(gbps, t);
      }
    }
    std::sort(f.busiest.begin(), f.busiest.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    if (f.busiest.size() > 10) f.busiest.resize(10);
    Print(f, json, tty);
    last_bytes = std::move(seen);
    last = now;
    first = false;
  }
  return 0;
}

}  // namespace kvrail::client::cli
