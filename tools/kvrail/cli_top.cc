#include "tools/kvrail/cli_top.h"

#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "tools/kvrail/cli_format.h"

namespace kvrail::client::cli {
namespace {

struct Frame {
  v1::Stats stats;
  // Per path: GB/s of the last minute's frames, oldest first (sparklines on a terminal).
  std::map<std::string, std::deque<double>> history;
  std::map<std::string, double> gbps_by_path;    // path name -> GB/s over the last interval
  std::map<std::string, int> transfers_by_path;  // active transfers per path
  std::vector<std::pair<double, v1::TransferStatus>> busiest;  // (GB/s, status)
  char sort = 'r';
};

// Puts a terminal's stdin in non-canonical, no-echo mode for single-key commands; restores it.
class RawStdin {
 public:
  RawStdin() {
    if (::isatty(STDIN_FILENO) != 1 || ::tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    active_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  ~RawStdin() {
    if (active_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  RawStdin(const RawStdin&) = delete;
  RawStdin& operator=(const RawStdin&) = delete;
  bool active() const { return active_; }

  // Waits up to `ms` for a key; returns it, or 0 when none came.
  char WaitKey(int ms) const {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return 0;
    char c = 0;
    return ::read(STDIN_FILENO, &c, 1) == 1 ? c : 0;
  }

 private:
  termios saved_{};
  bool active_ = false;
};

void Print(const Frame& f, bool json, bool tty) {
  const v1::Stats& s = f.stats;
  if (json) {
    std::cout << TopFrameJson(f.gbps_by_path, s) << std::endl;
    return;
  }
  std::string out = tty ? "\x1b[H\x1b[2J" : "";
  absl::StrAppend(&out, "kvraild ", s.version(), " on ", s.node_id(), "   regions ", s.regions(),
                  "   active ", s.transfers_active(), "   moved ", HumanBytes(s.bytes_moved()),
                  s.draining() ? "   DRAINING" : "", "\n\n");
  absl::StrAppend(&out, absl::StrFormat("%-28s %10s %10s%s\n", "PATH / LINK", "GB/s", "ACTIVE",
                                        tty ? "  LAST MINUTE" : ""));
  if (f.gbps_by_path.empty()) absl::StrAppend(&out, "(idle)\n");
  for (const auto& [path, gbps] : f.gbps_by_path) {
    auto it = f.transfers_by_path.find(path);
    auto h = f.history.find(path);
    const std::string spark =
        tty && h != f.history.end() ? "  " + Sparkline({h->second.begin(), h->second.end()}) : "";
    absl::StrAppend(&out, absl::StrFormat("%-28s %10.2f %10d%s\n", path, gbps,
                                          it == f.transfers_by_path.end() ? 0 : it->second, spark));
  }
  absl::StrAppend(&out, "\nQUEUED TILES ");
  for (const char* cls : {"critical", "normal", "background"}) {
    auto it = s.queued_tiles().find(cls);
    absl::StrAppend(&out, "  ", cls, " ", it == s.queued_tiles().end() ? 0 : it->second);
  }
  absl::StrAppend(&out, "\n\nENGINES\n");
  for (const auto& e : s.engines()) absl::StrAppend(&out, "  ", e, "\n");
  absl::StrAppend(
      &out, "\n",
      absl::StrFormat("%-18s %-10s %-12s %-22s %8s   sorted by %s%s\n", "TRANSFER", "PRIO", "PATH",
                      "DONE", "GB/s", TopSortName(f.sort),
                      tty ? " (keys: r rate, b bytes, l left, i id, p priority, q quit)" : ""));
  for (const auto& [gbps, t] : f.busiest) {
    absl::StrAppend(
        &out,
        absl::StrFormat("%-18d %-10s %-12s %-22s %8.2f\n", t.transfer_id(),
                        PriorityName(t.spec().priority()), PathName(t.path()),
                        HumanBytes(t.bytes_done()) + "/" + HumanBytes(t.bytes_total()), gbps));
  }
  std::cout << out << std::flush;
}

}  // namespace

std::string TopSortName(char key) {
  switch (key) {
    case 'r':
      return "rate";
    case 'b':
      return "bytes";
    case 'l':
      return "left";
    case 'i':
      return "id";
    case 'p':
      return "priority";
    default:
      return "";
  }
}

bool SortTopRows(char key, std::vector<std::pair<double, v1::TransferStatus>>* rows) {
  using Row = std::pair<double, v1::TransferStatus>;
  auto left = [](const v1::TransferStatus& t) {
    return t.bytes_total() - std::min(t.bytes_done(), t.bytes_total());
  };
  switch (key) {
    case 'r':
      std::stable_sort(rows->begin(), rows->end(),
                       [](const Row& a, const Row& b) { return a.first > b.first; });
      return true;
    case 'b':
      std::stable_sort(rows->begin(), rows->end(), [](const Row& a, const Row& b) {
        return a.second.bytes_done() > b.second.bytes_done();
      });
      return true;
    case 'l':
      std::stable_sort(rows->begin(), rows->end(),
                       [&](const Row& a, const Row& b) { return left(a.second) > left(b.second); });
      return true;
    case 'i':
      std::stable_sort(rows->begin(), rows->end(), [](const Row& a, const Row& b) {
        return a.second.transfer_id() > b.second.transfer_id();
      });
      return true;
    case 'p':
      // Critical (1) before normal (2; unspecified counts as normal) before background (3).
      std::stable_sort(rows->begin(), rows->end(), [](const Row& a, const Row& b) {
        auto rank = [](const v1::TransferStatus& t) {
          const int p = static_cast<int>(t.spec().priority());
          return p == 0 ? static_cast<int>(v1::PRIORITY_NORMAL) : p;
        };
        if (rank(a.second) != rank(b.second)) return rank(a.second) < rank(b.second);
        return a.first > b.first;
      });
      return true;
    default:
      return false;
  }
}

std::string Sparkline(const std::vector<double>& values) {
  static const char* const kBars[] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                      "\u2585", "\u2586", "\u2587", "\u2588"};
  double top = 0;
  for (double v : values) top = std::max(top, v);
  std::string out;
  for (double v : values) {
    if (top <= 0 || v <= 0) {
      out += " ";
      continue;
    }
    const int level = std::min(7, static_cast<int>(v / top * 7.999));
    out += kBars[level];
  }
  return out;
}

std::string TopFrameJson(const std::map<std::string, double>& gbps_by_path, const v1::Stats& s) {
  nlohmann::json frame;
  frame["gbps_by_path"] = nlohmann::json::object();
  for (const auto& [path, gbps] : gbps_by_path) frame["gbps_by_path"][path] = gbps;
  frame["queued_tiles"] = nlohmann::json::object();
  for (const auto& [cls, n] : s.queued_tiles()) frame["queued_tiles"][cls] = n;
  frame["transfers_active"] = s.transfers_active();
  frame["engines"] = nlohmann::json::array();
  for (const auto& e : s.engines()) frame["engines"].push_back(e);
  return frame.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

int RunTop(Client& client, bool json, uint32_t interval_ms, uint32_t iterations, char sort) {
  const bool tty = !json && ::isatty(STDOUT_FILENO) == 1;
  if (TopSortName(sort).empty()) {
    std::cerr << "kvrail: --sort: '" << sort << "' is not one of r, b, l, i, p\n";
    return 2;
  }
  std::optional<RawStdin> keys;
  if (tty) keys.emplace();
  if (interval_ms == 0) interval_ms = 1000;
  absl::flat_hash_map<uint64_t, uint64_t> last_bytes;
  std::map<std::string, std::deque<double>> history;
  const size_t history_frames = std::max<size_t>(2, 60000 / interval_ms);
  absl::Time last = absl::Now();
  bool first = true;
  for (uint32_t i = 0; iterations == 0 || i < iterations; ++i) {
    if (!first) {
      if (keys && keys->active()) {
        // Keys change the order at once (the frame is redrawn after the rest of the interval).
        const absl::Time until = absl::Now() + absl::Milliseconds(interval_ms);
        for (absl::Duration left = absl::Milliseconds(interval_ms); left > absl::ZeroDuration();
             left = until - absl::Now()) {
          const char c = keys->WaitKey(static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
          if (c == 'q') return 0;
          if (c != 0 && !TopSortName(c).empty()) sort = c;
        }
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
      }
    }
    Frame f;
    auto stats = client.GetStats();
    auto transfers = client.ListTransfers({}, 500);
    if (!stats.ok() || !transfers.ok()) {
      std::cerr << "kvrail: " << (stats.ok() ? transfers.status() : stats.status()).ToString()
                << "\n";
      return 1;
    }
    const absl::Time now = absl::Now();
    const double dt = std::max(1e-3, absl::ToDoubleSeconds(now - last));
    f.stats = *std::move(stats);
    absl::flat_hash_map<uint64_t, uint64_t> seen;
    for (const v1::TransferStatus& t : transfers->transfers()) {
      seen[t.transfer_id()] = t.bytes_done();
      const bool active =
          t.state() == v1::TRANSFER_STATE_QUEUED || t.state() == v1::TRANSFER_STATE_RUNNING;
      auto prev = last_bytes.find(t.transfer_id());
      // Transfers first seen count from zero only when they started within the interval.
      const uint64_t before =
          prev != last_bytes.end() ? prev->second : (first ? t.bytes_done() : 0);
      const double gbps =
          static_cast<double>(t.bytes_done() - std::min(before, t.bytes_done())) / dt / 1e9;
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
    SortTopRows(sort, &f.busiest);
    f.sort = sort;
    if (f.busiest.size() > 10) f.busiest.resize(10);
    // Every path seen in the last minute keeps a row; idle frames count as 0.
    for (auto& [path, samples] : history) {
      if (f.gbps_by_path.find(path) == f.gbps_by_path.end()) samples.push_back(0);
    }
    for (const auto& [path, gbps] : f.gbps_by_path) history[path].push_back(gbps);
    for (auto it = history.begin(); it != history.end();) {
      while (it->second.size() > history_frames) it->second.pop_front();
      const bool idle =
          std::all_of(it->second.begin(), it->second.end(), [](double v) { return v == 0; });
      if (idle && f.gbps_by_path.find(it->first) == f.gbps_by_path.end()) {
        it = history.erase(it);
      } else {
        f.gbps_by_path.emplace(it->first, 0.0);
        ++it;
      }
    }
    f.history = history;
    Print(f, json, tty);
    last_bytes = std::move(seen);
    last = now;
    first = false;
  }
  return 0;
}

}  // namespace kvrail::client::cli
