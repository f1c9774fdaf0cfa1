#include "daemon/transfers/notifications.h"

#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kvrail::transfers {

absl::Status CheckNotification(const v1::TransferSpec& spec) {
  if (spec.notification().size() > kMaxNotificationBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.notification: ", spec.notification().size(), " bytes; at most ",
                     kMaxNotificationBytes));
  }
  return absl::OkStatus();
}

std::vector<NotificationRecipient> NotificationRecipients(uint64_t src_region, uint64_t src_owner,
                                                          uint64_t dst_region, uint64_t dst_owner,
                                                          uint64_t submitter_session) {
  std::vector<NotificationRecipient> out;
  auto add = [&](uint64_t owner, uint64_t region, bool is_source) {
    if (owner == 0 || owner == submitter_session) return;
    for (const auto& r : out) {
      if (r.session_id == owner) return;  // one per session: the destination wins
    }
    out.push_back(NotificationRecipient{owner, region, is_source});
  };
  add(dst_owner, dst_region, false);
  add(src_owner, src_region, true);
  return out;
}

namespace {

// One session's queue. Guarded by the hub's mutex.
struct Queue {
  std::deque<v1::Notification> items;
  uint64_t dropped = 0;  // dropped since the last notification taken
  bool ended = false;    // the session ended while a waiter held this queue
};

// Thread-safe: queues_ and every Queue in it are guarded by mu_; waiters wait on mu_ with
// conditions over the queue they hold (a shared_ptr, so EndSession may drop it from the map).
class NotificationHubImpl final : public NotificationHub {
 public:
  NotificationHubImpl(std::function<bool(uint64_t)> session_open, size_t queue_limit)
      : session_open_(std::move(session_open)), limit_(queue_limit == 0 ? 1 : queue_limit) {}

  bool Deliver(uint64_t session_id, v1::Notification notification) override {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Queue> queue = QueueLocked(session_id);
    if (queue == nullptr) return false;
    if (queue->items.size() >= limit_) {
      queue->items.pop_front();
      ++queue->dropped;
    }
    notification.clear_dropped();
    queue->items.push_back(std::move(notification));
    return true;
  }

  absl::StatusOr<std::vector<v1::Notification>> Take(uint64_t session_id, uint32_t max,
                                                     absl::Duration timeout) override {
    if (max == 0) max = 256;
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Queue> queue = QueueLocked(session_id);
    if (queue == nullptr) return NotOpen(session_id);
    auto ready = [&queue]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !queue->items.empty() || queue->ended;
    };
    if (timeout > absl::ZeroDuration()) {
      mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    }
    if (queue->ended) return NotOpen(session_id);
    std::vector<v1::Notification> out;
    while (!queue->items.empty() && out.size() < max) {
      out.push_back(std::move(queue->items.front()));
      queue->items.pop_front();
      if (queue->dropped > 0) {
        out.back().set_dropped(queue->dropped);
        queue->dropped = 0;
      }
    }
    return out;
  }

  void EndSession(uint64_t session_id) override {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(session_id);
    if (it == queues_.end()) return;
    it->second->ended = true;  // wakes its waiters (their condition reads it)
    queues_.erase(it);
  }

  size_t Queued(uint64_t session_id) const override {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(session_id);
    return it == queues_.end() ? 0 : it->second->items.size();
  }

  size_t QueueCount() const override {
    absl::MutexLock lock(&mu_);
    return queues_.size();
  }

 private:
  static absl::Status NotOpen(uint64_t session_id) {
    return absl::NotFoundError(absl::StrCat("session_id: session ", session_id,
                                            " is not open (it never began or has ended)"));
  }

  // The session's queue, created on first use while the session is open; null otherwise.
  std::shared_ptr<Queue> QueueLocked(uint64_t session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = queues_.find(session_id);
    if (it != queues_.end()) return it->second;
    if (session_id == 0 || !session_open_(session_id)) return nullptr;
    auto queue = std::make_shared<Queue>();
    queues_.emplace(session_id, queue);
    return queue;
  }

  const std::function<bool(uint64_t)> session_open_;
  const size_t limit_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<NotificationHub> NotificationHub::Create(std::function<bool(uint64_t)> session_open,
                                                         size_t queue_limit) {
  return std::make_unique<NotificationHubImpl>(std::move(session_open), queue_limit);
}

}  // namespace kvrail::transfers
