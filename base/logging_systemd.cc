#include "base/logging_systemd.h"

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>
#include <unistd.h>

#include "base/logging.h"
#include "base/status.h"

namespace kvrail {
namespace {

// A status line must be one line: newlines would start new assignments.
std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

int SendToJournal(const struct iovec* items, int count) { return sd_journal_sendv(items, count); }

bool Notify(const std::string& state) {
  return sd_notify(/*unset_environment=*/0, state.c_str()) > 0;
}

}  // namespace

bool NotifyReady(const std::string& status) {
  // MAINPID: a hot restart's successor (started by ExecReload=, not by systemd) becomes the
  // unit's main process; for the process systemd started it changes nothing.
  return Notify("READY=1\nMAINPID=" + std::to_string(::getpid()) + "\nSTATUS=" + OneLine(status));
}

bool NotifyStopping(const std::string& status) {
  return Notify("STOPPING=1\nSTATUS=" + OneLine(status));
}

bool NotifyStatus(const std::string& status) { return Notify("STATUS=" + OneLine(status)); }

absl::Status SetUpDaemonLogging(const std::string& level, const std::string& format) {
  if (!StderrIsJournal()) return SetUpLogging(level, format);
  // JOURNAL_STREAM without journald's socket (a unit started while journald is down, a
  // container given systemd's environment): sd_journal_sendv would drop every entry and say it
  // sent them, so the lines go to stderr, each with its priority prefix.
  if (!JournalSocketExists()) {
    KVRAIL_RETURN_IF_ERROR(SetUpLogging(level, format));
    spdlog::warn("journald's socket {} is missing: logging to stderr", kJournalSocket);
    return absl::OkStatus();
  }
  return SetUpLoggingToJournal(level, SendToJournal);
}

void ReportStartError(std::string_view message) {
  const bool journal = StderrIsJournal();
  ReportStartErrorTo(message, journal && JournalSocketExists() ? SendToJournal : nullptr, journal);
}

}  // namespace kvrail
