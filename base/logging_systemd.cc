#include "base/logging_systemd.h"

#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>

#include "base/logging.h"

namespace kvrail {
namespace {

// A status line must be one line: newlines would start new assignments.
std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

bool Notify(const std::string& state) {
  return sd_notify(/*unset_environment=*/0, state.c_str()) > 0;
}

}  // namespace

bool NotifyReady(const std::string& status) {
  return Notify("READY=1\nSTATUS=" + OneLine(status));
}

bool NotifyStopping(const std::string& status) {
  return Notify("STOPPING=1\nSTATUS=" + OneLine(status));
}

bool NotifyStatus(const std::string& status) { return Notify("STATUS=" + OneLine(status)); }

absl::Status SetUpDaemonLogging(const std::string& level, const std::string& format) {
  if (!StderrIsJournal()) return SetUpLogging(level, format);
  return SetUpLoggingToJournal(level, [](const struct iovec* items, int count) {
    return sd_journal_sendv(items, count);
  });
}

void ReportStartError(std::string_view message) {
  if (!StderrIsJournal()) return ReportStartErrorTo(message, nullptr);
  ReportStartErrorTo(message, [](const struct iovec* items, int count) {
    return sd_journal_sendv(items, count);
  });
}

}  // namespace kvrail
