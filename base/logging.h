// Structured logging set-up for the daemon (spdlog). Modules log through spdlog's default logger;
// LogFields adds structured fields (transfer_id, path, bytes) that the JSON format writes as
// members of the line's object, not inside the message.
#pragma once

#include <spdlog/common.h>

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvrail {

// Configures the default logger: `level` is trace|debug|info|warn|error, `format` is text|json
// (json: one object per line with ts, level, thread, msg and any fields). Under journald
// (JOURNAL_STREAM names this process's stderr) each line starts with the syslog priority
// ("<6>" for info), so `journalctl -p warning` works, and text lines carry no time stamp of
// their own (the journal stamps them). Call once at start, before other threads.
absl::Status SetUpLogging(const std::string& level, const std::string& format);

// The same, writing to `out` instead of stderr, with journald prefixes on or off (tests).
absl::Status SetUpLoggingTo(const std::string& level, const std::string& format, bool journald,
                            std::ostream* out);

// True when stderr is connected to the journal: $JOURNAL_STREAM ("<dev>:<inode>") matches fd 2.
bool StderrIsJournal();

// One structured field. The value is kept JSON-encoded (a number, or a string escaped).
struct LogField {
  LogField(std::string_view key, std::string_view value);
  LogField(std::string_view key, const char* value) : LogField(key, std::string_view(value)) {}
  LogField(std::string_view key, const std::string& value) : LogField(key, std::string_view(value)) {}
  LogField(std::string_view key, uint64_t value);
  LogField(std::string_view key, int64_t value);
  LogField(std::string_view key, uint32_t value) : LogField(key, uint64_t{value}) {}
  LogField(std::string_view key, int value) : LogField(key, int64_t{value}) {}
  LogField(std::string_view key, double value);
  std::string key;
  std::string json;
};

// Logs `message` at `level` with `fields` through the default logger: JSON members beside "msg"
// in the json format, " key=value" after the message in text. Costs nothing below the level.
void LogFields(spdlog::level::level_enum level, std::string_view message,
               std::initializer_list<LogField> fields);

// `text` escaped for the inside of a JSON string.
std::string JsonEscape(std::string_view text);

}  // namespace kvrail
