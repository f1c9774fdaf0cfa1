#include "base/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>

namespace kvrail {
namespace {

// `%*`: the message, escaped for a JSON string, so any text logged keeps each line valid JSON.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (char c : msg.payload) {
      switch (c) {
        case '"': dest.append(std::string_view("\\\"")); break;
        case '\\': dest.append(std::string_view("\\\\")); break;
        case '\n': dest.append(std::string_view("\\n")); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            const char esc[6] = {'\\', 'u', '0', '0', kHex[(c >> 4) & 0xf], kHex[c & 0xf]};
            dest.append(esc, esc + 6);
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

}  // namespace

absl::Status SetUpLogging(const std::string& level, const std::string& format) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(level.empty() ? "info" : level);
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError("log_level: unknown level '" + level +
                                      "' (trace, debug, info, warn, error)");
  }
  auto logger = spdlog::stderr_logger_mt("kvraild");
  if (format.empty() || format == "text") {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%f %^%l%$ [%t] %v");
  } else if (format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","thread":%t,"msg":"%*"})");
    logger->set_formatter(std::move(formatter));
  } else {
    return absl::InvalidArgumentError("log_format: unknown format '" + format +
                                      "' (text, json)");
  }
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace kvrail
