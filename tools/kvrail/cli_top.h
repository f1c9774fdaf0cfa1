// `kvrail top`: live per-path throughput, queues, engines (SM budget) and the busiest transfers,
// refreshed in the terminal. Internal to the CLI.
#pragma once

#include <cstdint>

#include "client/kvrail_client.h"

namespace kvrail::client::cli {

// Polls the daemon every `interval_ms` for `iterations` frames (0: until interrupted). On a TTY
// each frame replaces the last; otherwise frames follow each other (--json: one object per line).
// Returns the process exit code.
int RunTop(Client& client, bool json, uint32_t interval_ms, uint32_t iterations);

}  // namespace kvrail::client::cli
