#include "base/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

namespace kvrail {
namespace {

// The fields of the line being logged on this thread (LogFields). The loggers here are
// synchronous, so the formatter runs on the logging thread, inside LogFields.
thread_local const std::initializer_list<LogField>* current_fields = nullptr;

void AppendJsonEscaped(std::string_view text, spdlog::memory_buf_t& dest) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char c : text) {
    switch (c) {
      case '"':
        dest.append(std::string_view("\\\""));
        break;
      case '\\':
        dest.append(std::string_view("\\\\"));
        break;
      case '\n':
        dest.append(std::string_view("\\n"));
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          const char esc[6] = {'\\', 'u', '0', '0', kHex[(c >> 4) & 0xf], kHex[c & 0xf]};
          dest.append(esc, esc + 6);
        } else {
          dest.push_back(c);
        }
    }
  }
}

// The text format's message: control characters (a client's region name with "\n<3>...", an
// ANSI escape sequence) become visible escapes - \n, \r, \t, \xNN - and a backslash is doubled,
// so one call writes one line that no logged string can split, colour or forge. With `quoted`
// (a field's value between double quotes) a double quote becomes \" as well.
void AppendTextEscaped(std::string_view text, spdlog::memory_buf_t& dest, bool quoted = false) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char c : text) {
    switch (c) {
      case '\\':
        dest.append(std::string_view("\\\\"));
        break;
      case '"':
        if (quoted) {
          dest.append(std::string_view("\\\""));
        } else {
          dest.push_back(c);
        }
        break;
      case '\n':
        dest.append(std::string_view("\\n"));
        break;
      case '\r':
        dest.append(std::string_view("\\r"));
        break;
      case '\t':
        dest.append(std::string_view("\\t"));
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          const char esc[4] = {'\\', 'x', kHex[(c >> 4) & 0xf], kHex[c & 0xf]};
          dest.append(esc, esc + 4);
        } else {
          dest.push_back(c);
        }
    }
  }
}

// `%*`: the message as a JSON string, then the line's fields as members ("msg":%* in the pattern),
// so any text logged keeps each line one valid JSON object.
class JsonMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    dest.push_back('"');
    AppendJsonEscaped(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    dest.push_back('"');
    if (current_fields == nullptr) return;
    for (const LogField& f : *current_fields) {
      dest.append(std::string_view(",\""));
      AppendJsonEscaped(f.key, dest);
      dest.append(std::string_view("\":"));
      dest.append(std::string_view(f.json));
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessage>();
  }
};

// `%~`: the message, then " key=value" for each field (text format): a number as it is, a
// string between double quotes with the message's escapes (the same bytes read the same way
// wherever they stand in a line).
class TextMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    AppendTextEscaped(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    if (current_fields == nullptr) return;
    for (const LogField& f : *current_fields) {
      dest.push_back(' ');
      AppendTextEscaped(f.key, dest);
      dest.push_back('=');
      if (f.json.empty() || f.json[0] != '"') {
        dest.append(std::string_view(f.json));
        continue;
      }
      dest.push_back('"');
      AppendTextEscaped(f.text, dest, /*quoted=*/true);
      dest.push_back('"');
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<TextMessage>();
  }
};

int SyslogPriority(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
    case spdlog::level::debug:
      return 7;
    case spdlog::level::info:
      return 6;
    case spdlog::level::warn:
      return 4;
    case spdlog::level::err:
      return 3;
    case spdlog::level::critical:
      return 2;
    default:
      return 6;
  }
}

// `%J`: the syslog priority journald reads from the start of a line ("<6>" for info).
class JournalPriority final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const int priority = SyslogPriority(msg.level);
    const char text[3] = {'<', static_cast<char>('0' + priority), '>'};
    dest.append(text, text + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JournalPriority>();
  }
};

// Sends items (owned strings) as one entry; false when the journal refused it.
bool SendItems(const JournalSend& send, std::vector<std::string>& items) {
  std::vector<struct iovec> iov(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    iov[i].iov_base = items[i].data();
    iov[i].iov_len = items[i].size();
  }
  return send(iov.data(), static_cast<int>(iov.size())) >= 0;
}

// The text format's pattern: under journald with the priority prefix and no time stamp (the
// journal stamps each line).
constexpr char kJournaldTextPattern[] = "%J%l [%t] %~";
constexpr char kTextPattern[] = "%Y-%m-%dT%H:%M:%S.%fZ %^%l%$ [%t] %~";

std::unique_ptr<spdlog::pattern_formatter> NewFormatter() {
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  formatter->add_flag<JsonMessage>('*');
  formatter->add_flag<TextMessage>('~');
  formatter->add_flag<JournalPriority>('J');
  return formatter;
}

// The journal sink (SetUpLoggingToJournal). Called on the logging thread, inside LogFields when
// there are fields (current_fields).
class JournalSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit JournalSink(JournalSend send) : send_(std::move(send)), fallback_(NewFormatter()) {
    fallback_->set_pattern(kJournaldTextPattern);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    TextMessage().format(msg, std::tm{}, line);
    const int priority = SyslogPriority(msg.level);
    std::vector<std::string> items;
    items.push_back("MESSAGE=" + std::string(line.data(), line.size()));
    items.push_back("PRIORITY=" + std::to_string(priority));
    items.push_back("SYSLOG_IDENTIFIER=kvraild");
    items.push_back("TID=" + std::to_string(msg.thread_id));
    if (current_fields != nullptr) {
      for (const LogField& f : *current_fields) {
        items.push_back(JournalFieldName(f.key) + "=" + f.text);
      }
    }
    if (!SendItems(send_, items)) {
      // The journal refused it (journald restarting): the line on stderr, which the journal also
      // reads, as the text format writes it under journald (priority prefix, level, thread).
      spdlog::memory_buf_t text;
      fallback_->format(msg, text);
      std::fwrite(text.data(), 1, text.size(), stderr);
    }
  }
  void flush_() override {}

 private:
  const JournalSend send_;
  const std::unique_ptr<spdlog::pattern_formatter> fallback_;  // under base_sink's mutex
};

absl::Status Configure(std::shared_ptr<spdlog::logger> logger, const std::string& level,
                       const std::string& format, bool journald) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(level.empty() ? "info" : level);
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError("log_level: unknown level '" + level +
                                      "' (trace, debug, info, warn, error)");
  }
  const std::string prefix = journald ? "%J" : "";
  std::unique_ptr<spdlog::pattern_formatter> formatter = NewFormatter();
  if (format.empty() || format == "text") {
    formatter->set_pattern(journald ? kJournaldTextPattern : kTextPattern);
  } else if (format == "json") {
    formatter->set_pattern(prefix +
                           R"({"ts":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","thread":%t,"msg":%*})");
  } else {
    return absl::InvalidArgumentError("log_format: unknown format '" + format + "' (text, json)");
  }
  logger->set_formatter(std::move(formatter));
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::drop(logger->name());
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace

bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr || *stream == '\0') return false;
  uintmax_t dev = 0, ino = 0;
  if (std::sscanf(stream, "%ju:%ju", &dev, &ino) != 2) return false;
  struct stat st;
  if (::fstat(2, &st) != 0) return false;
  return static_cast<uintmax_t>(st.st_dev) == dev && static_cast<uintmax_t>(st.st_ino) == ino;
}

bool JournalSocketExists(const char* path) {
  struct stat st;
  return ::stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

absl::Status SetUpLogging(const std::string& level, const std::string& format) {
  spdlog::drop("kvraild");
  return Configure(spdlog::stderr_logger_mt("kvraild"), level, format, StderrIsJournal());
}

absl::Status SetUpLoggingTo(const std::string& level, const std::string& format, bool journald,
                            std::ostream* out) {
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*out, /*force_flush=*/true);
  spdlog::drop("kvraild");
  return Configure(std::make_shared<spdlog::logger>("kvraild", std::move(sink)), level, format,
                   journald);
}

absl::Status SetUpLoggingToJournal(const std::string& level, JournalSend send) {
  if (!send) return absl::InvalidArgumentError("SetUpLoggingToJournal: no sender");
  spdlog::drop("kvraild");
  auto logger =
      std::make_shared<spdlog::logger>("kvraild", std::make_shared<JournalSink>(std::move(send)));
  // The level is parsed as for the other formats; the formatter is unused by the sink.
  return Configure(std::move(logger), level, "text", /*journald=*/true);
}

void ReportStartErrorTo(std::string_view message, const JournalSend& send, bool stderr_is_journal) {
  spdlog::memory_buf_t line;
  line.append(std::string_view("kvraild: "));
  AppendTextEscaped(message, line);
  std::string text(line.data(), line.size());
  if (send) {
    std::vector<std::string> items = {"MESSAGE=" + text, "PRIORITY=3", "SYSLOG_IDENTIFIER=kvraild"};
    if (SendItems(send, items)) return;
  }
  if (stderr_is_journal) text = "<3>" + text;
  text += '\n';
  std::fputs(text.c_str(), stderr);
}

std::string JournalFieldName(std::string_view key) {
  std::string name = "KVRAIL_";
  for (char c : key) {
    const unsigned char u = static_cast<unsigned char>(c);
    name += std::isalnum(u) ? static_cast<char>(std::toupper(u)) : '_';
  }
  return name.substr(0, 64);  // journald's limit on a field name
}

std::string JsonEscape(std::string_view text) {
  spdlog::memory_buf_t buf;
  AppendJsonEscaped(text, buf);
  return std::string(buf.data(), buf.size());
}

LogField::LogField(std::string_view k, std::string_view value)
    : key(k), json("\"" + JsonEscape(value) + "\""), text(value) {}
LogField::LogField(std::string_view k, uint64_t value)
    : key(k), json(std::to_string(value)), text(json) {}
LogField::LogField(std::string_view k, int64_t value)
    : key(k), json(std::to_string(value)), text(json) {}
LogField::LogField(std::string_view k, double value) : key(k) {
  if (!std::isfinite(value)) {
    json = "null";
    text = std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
    return;
  }
  char number[32];
  std::snprintf(number, sizeof(number), "%.6g", value);
  json = number;
  text = json;
}

bool ShouldLog(spdlog::level::level_enum level) {
  return spdlog::default_logger_raw()->should_log(level);
}

void LogFields(spdlog::level::level_enum level, std::string_view message,
               std::initializer_list<LogField> fields) {
  spdlog::logger* logger = spdlog::default_logger_raw();
  if (!logger->should_log(level)) return;
  current_fields = &fields;
  logger->log(level, "{}", message);
  current_fields = nullptr;
}

}  // namespace kvrail
