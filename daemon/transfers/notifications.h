// Notifications (TransferSpec.notification): per-session bounded queues of v1::Notification that
// the transfer manager fills when a transfer ends and PollNotifications / WatchNotifications
// drain. A queue exists only while its session is open: deliveries to a closed or unknown
// session are dropped, and ending a session drops its queue and wakes its waiters.
//
// Who receives a transfer's notification is decided by NotificationRecipients (pure); the
// manager calls Deliver for each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::transfers {

// Longest TransferSpec.notification accepted (INVALID_ARGUMENT naming spec.notification beyond).
inline constexpr size_t kMaxNotificationBytes = 1024;
// Per-session queue bound: when full, the oldest notification is dropped (and counted in the
// `dropped` field of the next one taken).
inline constexpr size_t kNotificationQueueLimit = 4096;

// INVALID_ARGUMENT naming spec.notification when it is longer than kMaxNotificationBytes.
absl::Status CheckNotification(const v1::TransferSpec& spec);

// One recipient of a transfer's notification: a session and the region of it the transfer used.
struct NotificationRecipient {
  uint64_t session_id = 0;
  uint64_t region_id = 0;
  bool region_is_source = false;
  bool operator==(const NotificationRecipient& o) const {
    return session_id == o.session_id && region_id == o.region_id &&
           region_is_source == o.region_is_source;
  }
};

// The owners of a transfer's regions that receive its notification: each distinct non-zero
// owning session of the destination, then the source, except `submitter_session` (0: unknown,
// nobody excluded). A session owning both regions is listed once, with the destination. An owner
// of 0 (no session, or a region on another node) receives nothing. Pure.
std::vector<NotificationRecipient> NotificationRecipients(uint64_t src_region, uint64_t src_owner,
                                                          uint64_t dst_region, uint64_t dst_owner,
                                                          uint64_t submitter_session);

// Thread-safe: every queue is guarded by the hub's mutex; Deliver is quick and never blocks (it
// may be called under a transfer record's lock). Take blocks only its caller.
class NotificationHub {
 public:
  virtual ~NotificationHub() = default;
  // `session_open` says whether a session id is open (RegionTable::SessionOpen); it is called
  // under the hub's lock, so it must not call back into the hub. `queue_limit` > 0.
  static std::unique_ptr<NotificationHub> Create(std::function<bool(uint64_t)> session_open,
                                                 size_t queue_limit = kNotificationQueueLimit);

  // Queues `notification` for `session_id` when that session is open (its `dropped` field is
  // overwritten); otherwise drops it. Returns whether it was queued.
  virtual bool Deliver(uint64_t session_id, v1::Notification notification) = 0;
  // Takes up to `max` (0: 256) queued notifications of the session, oldest first, waiting up to
  // `timeout` (real time) for the first when none is queued. NOT_FOUND naming session_id when the
  // session is not open (also when it ends during the wait).
  virtual absl::StatusOr<std::vector<v1::Notification>> Take(uint64_t session_id, uint32_t max,
                                                             absl::Duration timeout) = 0;
  // The session ended: its queue is dropped and its waiters return NOT_FOUND.
  virtual void EndSession(uint64_t session_id) = 0;
  // Notifications queued for the session (0 when it has no queue).
  virtual size_t Queued(uint64_t session_id) const = 0;
  // Sessions with a queue (for tests: a session's queue goes away with it).
  virtual size_t QueueCount() const = 0;
};

}  // namespace kvrail::transfers
