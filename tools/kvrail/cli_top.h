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
// `sort` is the initial order of the transfers table (a TopSortKey letter); on a TTY the keys
// r, b, l, i, p change it while running and q quits.
int RunTop(Client& client, bool json, uint32_t interval_ms, uint32_t iterations, char sort = 'r');

// The transfers table's orders, by key: 'r' rate (GB/s over the last interval, highest first),
// 'b' bytes done (most first), 'l' bytes left (most first), 'i' transfer id (newest first),
// 'p' priority (critical first, then rate). Returns false (and leaves `rows` alone) for any other.
bool SortTopRows(char key, std::vector<std::pair<double, v1::TransferStatus>>* rows);

// The name of a sort key for the header ("rate", "bytes", ...); "" when it is not one.
std::string TopSortName(char key);

// A sparkline of `values` scaled to their maximum ("▁▃█"); zero (and all-zero) values are blanks.
std::string Sparkline(const std::vector<double>& values);

// One `top --json` frame: {"gbps_by_path":{...},"queued_tiles":{...},"transfers_active":N,
// "engines":[...]}, built with nlohmann::json (every string escaped, control characters too).
std::string TopFrameJson(const std::map<std::string, double>& gbps_by_path, const v1::Stats& stats);

}  // namespace kvrail::client::cli
