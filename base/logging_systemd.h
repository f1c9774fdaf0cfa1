// systemd service notifications (sd_notify): READY=1 once kvraild serves, STOPPING=1 when it
// drains, STATUS=<summary> for `systemctl status`. Without $NOTIFY_SOCKET (not started by systemd
// with Type=notify) every call does nothing.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvrail {

// Thread-safe. Each returns whether systemd was told (false outside a notify unit or on error).
// READY=1 with MAINPID= this process: a hot restart's successor, which systemd did not start,
// becomes the unit's main process (NotifyAccess=all); for the process systemd started it changes
// nothing.
bool NotifyReady(const std::string& status);
bool NotifyStopping(const std::string& status);
bool NotifyStatus(const std::string& status);

// kvraild's logging: under journald (StderrIsJournal, and its socket kJournalSocket exists)
// straight to the journal's native protocol (sd_journal_sendv: SetUpLoggingToJournal's fields);
// elsewhere SetUpLogging on stderr, whose lines carry their priority prefix while stderr is the
// journal's stream (then a warning says the socket is missing).
absl::Status SetUpDaemonLogging(const std::string& level, const std::string& format);

// A fatal start error: under journald one entry at error priority (PRIORITY=3), else one line on
// stderr (ReportStartErrorTo), prefixed "<3>" while stderr is the journal's stream.
void ReportStartError(std::string_view message);

}  // namespace kvrail
