// `kvrail top`: live per-path throughput, queues, engines (SM budget) and the busiest transfers,
// refreshed in the terminal. Internal to the CLI.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "client/kvrail_client.h"

namespace kvrail::client::cli {

// Polls the daemon every `interval_ms` for `iterations` frames (0: until interrupted). On a TTY
// each frame replaces the last; otherwise frames follow each other (--json: one object per line).
// Returns the process exit code.
int RunTop(Client& client, bool json, uint32_t interval_ms, uint32_t iterations);

// A sparkline of `values` scaled to their maximum ("▁▃█"); zero (and all-zero) values are blanks.
std::string Sparkline(const std::vector<double>& values);

// One `top --json` frame: {"gbps_by_path":{...},"queued_tiles":{...},"transfers_active":N,
// "engines":[...]}, built with nlohmann::json (every string escaped, control characters too).
std::string TopFrameJson(const std::map<std::string, double>& gbps_by_path, const v1::Stats& stats);

}  // namespace kvrail::client::cli
