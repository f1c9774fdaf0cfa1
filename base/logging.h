// Structured logging set-up for the daemon (spdlog). Modules log through spdlog's default logger.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace kvrail {

// Configures the default logger: `level` is trace|debug|info|warn|error, `format` is text|json
// (json: one object per line with ts, level, msg). Call once at start, before other threads.
absl::Status SetUpLogging(const std::string& level, const std::string& format);

}  // namespace kvrail
