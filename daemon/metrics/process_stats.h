// The process_* metrics Prometheus' client libraries export (prometheus-cpp has no collector for
// them): CPU seconds, resident and virtual memory, open and maximum file descriptors, start time.
// Read from /proc; the parsing is pure and unit-tested on recorded text.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::metrics {

struct ProcessStats {
  double cpu_seconds = 0;  // user + system
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double start_time_seconds = 0;  // Unix time
  double open_fds = 0;
  double max_fds = 0;  // RLIMIT_NOFILE's soft limit
};

// From /proc/<pid>/stat (`stat`) and the system's /proc/stat (`system_stat`, for btime), with
// the clock tick rate and page size of the machine. INVALID_ARGUMENT naming what is missing.
absl::StatusOr<ProcessStats> ParseProcessStats(absl::string_view stat,
                                               absl::string_view system_stat, long ticks_per_second,
                                               long page_bytes);

// This process's, now (adds open_fds from /proc/self/fd and max_fds from getrlimit).
absl::StatusOr<ProcessStats> ReadProcessStats();

}  // namespace kvrail::metrics
