// systemd service notifications (sd_notify): READY=1 once kvraild serves, STOPPING=1 when it
// drains, STATUS=<summary> for `systemctl status`. Without $NOTIFY_SOCKET (not started by systemd
// with Type=notify) every call does nothing.
#pragma once

#include <string>

namespace kvrail {

// Thread-safe. Each returns whether systemd was told (false outside a notify unit or on error).
bool NotifyReady(const std::string& status);
bool NotifyStopping(const std::string& status);
bool NotifyStatus(const std::string& status);

}  // namespace kvrail
