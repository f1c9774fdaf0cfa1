#include "daemon/metrics/process_stats.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvrail::metrics {
namespace {

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<ProcessStats> ParseProcessStats(absl::string_view stat,
                                               absl::string_view system_stat, long ticks_per_second,
                                               long page_bytes) {
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
  // from the last ')'. After it, field 3 (state) is index 0: utime is field 14, stime 15,
  // starttime 22, vsize 23, rss 24.
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("/proc/self/stat: no ')' closing the command name");
  }
  std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipWhitespace());
  auto field = [&](int number, uint64_t* out) -> absl::Status {
    const size_t index = static_cast<size_t>(number - 3);
    if (index >= fields.size() || !absl::SimpleAtoi(fields[index], out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("/proc/self/stat: field ", number, " is missing or not a number"));
    }
    return absl::OkStatus();
  };
  uint64_t utime = 0, stime = 0, starttime = 0, vsize = 0, rss = 0;
  for (auto [number, out] :
       {std::pair{14, &utime}, {15, &stime}, {22, &starttime}, {23, &vsize}, {24, &rss}}) {
    if (absl::Status s = field(number, out); !s.ok()) return s;
  }
  uint64_t btime = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(system_stat, '\n')) {
    if (line.rfind("btime ", 0) == 0) found = absl::SimpleAtoi(line.substr(6), &btime);
  }
  if (!found) return absl::InvalidArgumentError("/proc/stat: no btime line");
  if (ticks_per_second <= 0 || page_bytes <= 0) {
    return absl::InvalidArgumentError("ticks_per_second and page_bytes must be positive");
  }
  ProcessStats out;
  const double ticks = static_cast<double>(ticks_per_second);
  out.cpu_seconds = static_cast<double>(utime + stime) / ticks;
  out.start_time_seconds = static_cast<double>(btime) + static_cast<double>(starttime) / ticks;
  out.virtual_bytes = static_cast<double>(vsize);
  out.resident_bytes = static_cast<double>(rss) * static_cast<double>(page_bytes);
  return out;
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  absl::StatusOr<ProcessStats> out =
      ParseProcessStats(ReadFile("/proc/self/stat"), ReadFile("/proc/stat"), ::sysconf(_SC_CLK_TCK),
                        ::sysconf(_SC_PAGESIZE));
  if (!out.ok()) return out;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    int n = 0;
    while (const dirent* e = ::readdir(dir)) {
      if (e->d_name[0] != '.') ++n;
    }
    ::closedir(dir);
    out->open_fds = n - 1;  // not the directory's own descriptor
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) out->max_fds = static_cast<double>(limit.rlim_cur);
  return out;
}

}  // namespace kvrail::metrics
