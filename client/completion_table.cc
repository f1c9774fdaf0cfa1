#include "client/completion_table.h"

#include <poll.h>
#include <time.h>

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace kvrail::client {
namespace {

// Completions remembered after their transfer ended; older ones are read the old way again.
constexpr size_t kRemembered = size_t{1} << 18;

}  // namespace

absl::StatusOr<std::unique_ptr<CompletionTable>> CompletionTable::Create(uint32_t capacity,
                                                                         absl::Duration max_spin) {
  absl::StatusOr<std::unique_ptr<wire::SharedRing>> ring =
      wire::SharedRing::Create(capacity, wire::kCompletionEntryBytes);
  if (!ring.ok()) return ring.status();
  return std::unique_ptr<CompletionTable>(
      new CompletionTable(std::move(*ring), std::max(max_spin, absl::ZeroDuration())));
}

uint64_t CompletionTable::OverflowMark() {
  absl::MutexLock lock(&mu_);
  return ring_->view().overflow();
}

void CompletionTable::Follow(uint64_t id, uint64_t mark) {
  absl::MutexLock lock(&mu_);
  if (done_.contains(id)) return;
  pending_.insert(id);
  if (broken_ || ring_->view().overflow() != mark) unsure_.insert(id);
}

bool CompletionTable::Follows(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return pending_.contains(id) || done_.contains(id);
}

void CompletionTable::Remember(const wire::Completion& completion) {
  if (armed_) fresh_.push_back(completion.transfer_id);
  pending_.erase(completion.transfer_id);
  unsure_.erase(completion.transfer_id);
  if (done_.insert_or_assign(completion.transfer_id, completion).second) {
    done_order_.push_back(completion.transfer_id);
    if (done_order_.size() > kRemembered) {
      done_.erase(done_order_.front());
      done_order_.pop_front();
    }
  }
}

bool CompletionTable::DrainLocked() {
  bool changed = false;
  constexpr size_t kBatch = 64;
  while (!broken_) {
    // Parsed into locals (the callback runs inside Pop), remembered after.
    wire::Completion batch[kBatch];
    size_t count = 0, refused = 0;
    absl::StatusOr<size_t> taken =
        ring_->view().Pop(kBatch, [&](const uint8_t* bytes, size_t size) {
          absl::StatusOr<wire::Completion> c = wire::ParseCompletion(bytes, size);
          if (c.ok()) {
            batch[count++] = *c;
          } else {
            ++refused;
          }
        });
    if (!taken.ok()) broken_ = true;  // a daemon bug or a scribble: the old way from here on
    refused_ += refused;
    for (size_t i = 0; i < count; ++i) Remember(batch[i]);
    taken_ += count;
    changed = changed || count > 0;
    if (!taken.ok() || *taken < kBatch) break;
  }
  const uint64_t overflow = ring_->view().overflow();
  if ((overflow != overflow_seen_ || broken_) && !pending_.empty()) {
    for (uint64_t id : pending_) {
      if (unsure_.insert(id).second && armed_) fresh_.push_back(id);
    }
    changed = true;
  }
  overflow_seen_ = overflow;
  if (changed) changed_.SignalAll();
  return changed;
}

CompletionTable::Result CompletionTable::LookLocked(uint64_t id) {
  Result result;
  if (auto it = done_.find(id); it != done_.end()) {
    result.outcome = Outcome::kDone;
    result.completion = it->second;
  } else if (unsure_.contains(id) || !pending_.contains(id)) {
    result.outcome = Outcome::kUnsure;
  }
  return result;
}

CompletionTable::Result CompletionTable::Peek(uint64_t id) {
  absl::MutexLock lock(&mu_);
  DrainLocked();
  return LookLocked(id);
}

void CompletionTable::States(const uint64_t* ids, size_t count, int32_t* states) {
  absl::MutexLock lock(&mu_);
  DrainLocked();
  for (size_t i = 0; i < count; ++i) {
    if (auto it = done_.find(ids[i]); it != done_.end()) {
      states[i] = it->second.state;
    } else if (pending_.contains(ids[i]) && !unsure_.contains(ids[i])) {
      states[i] = 2;  // TRANSFER_STATE_RUNNING: followed, not ended
    }
  }
}

CompletionTable::Result CompletionTable::Wait(uint64_t id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  DrainLocked();
  Result result = LookLocked(id);
  if (result.outcome != Outcome::kTimeout) return result;
  // Spin: poll the ring without sleeping (a thread wake-up costs more than a short transfer).
  const absl::Time spin_until = std::min(deadline, absl::Now() + spin_);
  bool spun = false;
  while (spin_ > absl::ZeroDuration() && absl::Now() < spin_until) {
    spun = true;
    if (!ring_->view().Ready()) {
      // Other threads may drain meanwhile: the lock is let go between looks.
      mu_.Unlock();
      for (int i = 0; i < 32; ++i) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
      mu_.Lock();
    }
    DrainLocked();
    result = LookLocked(id);
    if (result.outcome != Outcome::kTimeout) {
      ++spin_hits_;
      spin_ = max_spin_;  // it paid: keep the full spin
      return result;
    }
  }
  if (spun) spin_ = std::max(spin_ / 2, max_spin_ / 8);  // it missed: spin less next time
  while (true) {
    DrainLocked();
    result = LookLocked(id);
    if (result.outcome != Outcome::kTimeout) return result;
    const absl::Time now = absl::Now();
    if (now >= deadline) return result;
    if (sleeper_) {
      changed_.WaitWithDeadline(&mu_, deadline);
      continue;
    }
    // This thread sleeps on the eventfd for everyone: announce it, look once more, sleep.
    sleeper_ = true;
    UpdateNeedWakeLocked();
    if (!ring_->view().Ready() && ring_->view().overflow() == overflow_seen_) {
      pollfd p{ring_->eventfd(), POLLIN, 0};
      mu_.Unlock();
      const absl::Duration left = std::min(deadline - now, absl::Seconds(1));
      const timespec ts = absl::ToTimespec(left);
      (void)::ppoll(&p, 1, &ts, nullptr);
      mu_.Lock();
    }
    ring_->DrainWakes();
    sleeper_ = false;
    UpdateNeedWakeLocked();
    changed_.SignalAll();  // another waiter may take the eventfd over
  }
}

void CompletionTable::Resolve(const wire::Completion& completion) {
  absl::MutexLock lock(&mu_);
  Remember(completion);
  changed_.SignalAll();
}

void CompletionTable::UpdateNeedWakeLocked() { ring_->view().SetNeedWake(sleeper_ || armed_); }

void CompletionTable::SetArmed(bool armed) {
  absl::MutexLock lock(&mu_);
  armed_ = armed;
  if (!armed) fresh_.clear();
  UpdateNeedWakeLocked();
}

size_t CompletionTable::Drain() {
  absl::MutexLock lock(&mu_);
  // Counted as they are taken, not from the remembered ends' size: that stays at its bound once
  // the oldest ends are let go.
  const uint64_t before = taken_;
  if (!sleeper_) ring_->DrainWakes();  // a sleeping waiter clears it itself
  DrainLocked();
  return static_cast<size_t>(taken_ - before);
}

size_t CompletionTable::TakeFresh(uint64_t* ids, size_t max) {
  absl::MutexLock lock(&mu_);
  if (!sleeper_) ring_->DrainWakes();
  DrainLocked();
  size_t n = 0;
  while (n < max && !fresh_.empty()) {
    ids[n++] = fresh_.front();
    fresh_.pop_front();
  }
  return n;
}

void CompletionTable::Abandon() {
  absl::MutexLock lock(&mu_);
  broken_ = true;
  for (uint64_t id : pending_) {
    if (unsure_.insert(id).second && armed_) fresh_.push_back(id);
  }
  changed_.SignalAll();
  ring_->Wake();  // the sleeper on the eventfd
}

uint64_t CompletionTable::refused_entries() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

uint64_t CompletionTable::spin_hits() const {
  absl::MutexLock lock(&mu_);
  return spin_hits_;
}

}  // namespace kvrail::client
