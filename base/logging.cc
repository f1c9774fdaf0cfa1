#include "base/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
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
      case '"': dest.append(std::string_view("\\\"")); break;
      case '\\': dest.append(std::string_view("\\\\")); break;
      case '\n': dest.append(std::string_view("\\n")); break;
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
// so one call writes one line that no logged string can split, colour or forge.
void AppendTextEscaped(std::string_view text, spdlog::memory_buf_t& dest) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char c : text) {
    switch (c) {
      case '\\': dest.append(std::string_view("\\\\")); break;
      case '\n': dest.append(std::string_view("\\n")); break;
      case '\r': dest.append(std::string_view("\\r")); break;
      case '\t': dest.append(std::string_view("\\t")); break;
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

// `%~`: the message, then " key=value" for each field (text format).
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
      dest.append(std::string_view(f.json));
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<TextMessage>();
  }
};

// `%J`: the syslog priority journald reads from the start of a line ("<6>" for info).
class JournalPriority final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    int priority = 6;
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug: priority = 7; break;
      case spdlog::level::info: priority = 6; break;
      case spdlog::level::warn: priority = 4; break;
      case spdlog::level::err: priority = 3; break;
      case spdlog::level::critical: priority = 2; break;
      default: break;
    }
    const char text[3] = {'<', static_cast<char>('0' + priority), '>'};
    dest.append(text, text + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JournalPriority>();
  }
};

absl::Status Configure(std::shared_ptr<spdlog::logger> logger, const std::string& level,
                       const std::string& format, bool journald) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(level.empty() ? "info" : level);
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError("log_level: unknown level '" + level +
                                      "' (trace, debug, info, warn, error)");
  }
  const std::string prefix = journald ? "%J" : "";
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  formatter->add_flag<JsonMessage>('*');
  formatter->add_flag<TextMessage>('~');
  formatter->add_flag<JournalPriority>('J');
  if (format.empty() || format == "text") {
    // The journal stamps each line itself.
    formatter->set_pattern(journald ? "%J%l [%t] %~" : "%Y-%m-%dT%H:%M:%S.%fZ %^%l%$ [%t] %~");
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

std::string JsonEscape(std::string_view text) {
  spdlog::memory_buf_t buf;
  AppendJsonEscaped(text, buf);
  return std::string(buf.data(), buf.size());
}

LogField::LogField(std::string_view k, std::string_view value)
    : key(k), json("\"" + JsonEscape(value) + "\"") {}
LogField::LogField(std::string_view k, uint64_t value) : key(k), json(std::to_string(value)) {}
LogField::LogField(std::string_view k, int64_t value) : key(k), json(std::to_string(value)) {}
LogField::LogField(std::string_view k, double value) : key(k) {
  if (!std::isfinite(value)) {
    json = "null";
    return;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  json = text;
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
