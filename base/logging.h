// Structured logging set-up for the daemon (spdlog). Modules log through spdlog's default logger;
// LogFields adds structured fields (transfer_id, path, bytes) that the JSON format writes as
// members of the line's object, not inside the message.
#pragma once

#include <spdlog/common.h>
#include <sys/uio.h>

#include <cstdint>
#include <functional>
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

// journald's native-protocol socket. sd_journal_sendv reports success when it is missing (the
// entry is dropped), so kvraild looks for it before choosing the native protocol.
inline constexpr char kJournalSocket[] = "/run/systemd/journal/socket";

// True when `path` is a unix socket.
bool JournalSocketExists(const char* path = kJournalSocket);

// Sends one journal entry made of "FIELD=value" items; >= 0 when it was sent (sd_journal_sendv's
// contract). //base:logging_systemd has the real one; tests pass a fake.
using JournalSend = std::function<int(const struct iovec* items, int count)>;

// Logs through the journal's native protocol: one entry per line, with MESSAGE (the message and
// its fields escaped as in the text format: one line no logged text can split or forge), PRIORITY
// (the syslog level: 7 debug, 6 info, 4 warn, 3 error, 2 critical), SYSLOG_IDENTIFIER=kvraild,
// TID, and each LogField as a field of its own, KVRAIL_<KEY>, holding the raw value (journald
// stores any bytes: `journalctl -o verbose` or `KVRAIL_REGION_NAME=...` matches show it as given).
// log_format does not apply: the journal keeps the fields itself.
absl::Status SetUpLoggingToJournal(const std::string& level, JournalSend send);

// A fatal start error: with `send` one journal entry at PRIORITY=3 whose MESSAGE is
// "kvraild: <message>" escaped to one line; without it (nullptr), or when the journal refused
// the entry, that line on stderr, prefixed "<3>" when `stderr_is_journal` (journald reads the
// priority from it).
void ReportStartErrorTo(std::string_view message, const JournalSend& send, bool stderr_is_journal);

// "region_name" -> "KVRAIL_REGION_NAME" (journal field names: upper case letters, digits, '_').
std::string JournalFieldName(std::string_view key);

// One structured field. The value is kept JSON-encoded (a number, or a string escaped) for the
// text and JSON formats, and as given for the journal.
struct LogField {
  LogField(std::string_view key, std::string_view value);
  LogField(std::string_view key, const char* value) : LogField(key, std::string_view(value)) {}
  LogField(std::string_view key, const std::string& value)
      : LogField(key, std::string_view(value)) {}
  LogField(std::string_view key, uint64_t value);
  LogField(std::string_view key, int64_t value);
  LogField(std::string_view key, uint32_t value) : LogField(key, uint64_t{value}) {}
  LogField(std::string_view key, int value) : LogField(key, int64_t{value}) {}
  LogField(std::string_view key, double value);
  std::string key;
  std::string json;
  std::string text;  // the value as given (strings) or in decimal (numbers)
};

// Logs `message` at `level` with `fields` through the default logger: JSON members beside "msg"
// in the json format, " key=value" after the message in text. Below the level it writes nothing,
// but the caller has built `fields` already (strings, JSON escapes, numbers printed): on a hot
// path log through KVRAIL_LOG_FIELDS, which builds them only where the line is written.
void LogFields(spdlog::level::level_enum level, std::string_view message,
               std::initializer_list<LogField> fields);

// Whether the default logger writes lines of `level`.
bool ShouldLog(spdlog::level::level_enum level);

// LogFields(level, message, {fields...}), the fields evaluated only when `level` is written.
#define KVRAIL_LOG_FIELDS(level, message, ...)          \
  do {                                                  \
    if (::kvrail::ShouldLog(level)) {                   \
      ::kvrail::LogFields(level, message, __VA_ARGS__); \
    }                                                   \
  } while (false)

// spdlog::debug(...) with its arguments evaluated only when debug lines are written: spdlog's
// own call takes them already built (a plan's description, a joined list, a status printed),
// below the level too. Every debug line goes through it (tests/lint: debug_log_lint.py).
#define KVRAIL_DEBUG(...)                            \
  do {                                               \
    if (::kvrail::ShouldLog(spdlog::level::debug)) { \
      spdlog::debug(__VA_ARGS__);                    \
    }                                                \
  } while (false)

// `text` escaped for the inside of a JSON string.
std::string JsonEscape(std::string_view text);

}  // namespace kvrail
