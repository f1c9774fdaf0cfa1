#include "client/completion_table.h"

#include <poll.h>
#include <time.h>

#include <algorithm>
#include <random>
#include <utility>

#include "absl/time/clock.h"
#include "base/spin_budget.h"
#include "base/spin_pause.h"

namespace kvrail::client {
absl::StatusOr<std::unique_ptr<CompletionTable>> CompletionTable::Create(uint32_t capacity,
                                                                         absl::Duration max_spin) {
  absl::StatusOr<std::unique_ptr<wire::SharedRing>> ring =
      wire::SharedRing::Create(capacity, wire::kCompletionEntryBytes);
  if (!ring.ok()) return ring.status();
  std::unique_ptr<CompletionTable> table(
      new CompletionTable(std::move(*ring), std::max(max_spin, absl::ZeroDuration())));
  {
    absl::MutexLock lock(&table->mu_);
    table->done_.reserve(kRememberedEnds + 1);  // the bound plus the one Remember adds first
  }
  return table;
}

uint64_t CompletionTable::OverflowMark() {
  absl::MutexLock lock(&mu_);
  return ring_->view().overflow();
}

void CompletionTable::EnableDoneWords(uint64_t* words, uint32_t count, uint64_t region_id) {
  absl::MutexLock lock(&mu_);
  words_ = words;
  words_region_ = words != nullptr ? region_id : 0;
  free_slots_.clear();
  if (words == nullptr) return;
  free_slots_.reserve(count);
  // Taken from the back: slot 0 first, and a slot just given back is the next one taken. Slots
  // of transfers still followed in the same words stay out of the list until they are given back.
  for (uint32_t i = count; i > 0; --i) {
    bool busy = false;
    for (const auto& [id, w] : watched_) busy = busy || w.word == words + (i - 1);
    if (!busy) free_slots_.push_back(i - 1);
  }
  // A random base: values stay unique even where another table used the same words before.
  if (next_value_ == 0) {
    std::random_device rd;
    next_value_ = ((uint64_t{rd()} << 32) | rd()) | 1;
  }
}

std::optional<CompletionTable::DoneSlot> CompletionTable::TakeDoneSlot() {
  absl::MutexLock lock(&mu_);
  if (words_ == nullptr || free_slots_.empty() || broken_) return std::nullopt;
  DoneSlot slot;
  slot.index = free_slots_.back();
  free_slots_.pop_back();
  slot.value = next_value_++;
  if (slot.value == 0) slot.value = next_value_++;  // 0 is never a done word's value
  slot.region_id = words_region_;
  return slot;
}

void CompletionTable::ReturnDoneSlot(const DoneSlot& slot) {
  absl::MutexLock lock(&mu_);
  if (words_ != nullptr && slot.region_id == words_region_) free_slots_.push_back(slot.index);
}

void CompletionTable::Follow(uint64_t id, uint64_t mark, std::optional<DoneSlot> slot,
                             uint64_t bytes_total) {
  absl::MutexLock lock(&mu_);
  const bool current = slot.has_value() && words_ != nullptr && slot->region_id == words_region_;
  if (done_.contains(id)) {
    if (current) free_slots_.push_back(slot->index);
    return;
  }
  pending_.insert(id);
  if (broken_ || ring_->view().overflow() != mark) unsure_.insert(id);
  // A slot of words that moved meanwhile (the region was made again) is not watched: that
  // transfer's end comes from the daemon.
  if (current) watched_[id] = Watched{*slot, words_ + slot->index, bytes_total};
}

void CompletionTable::ReleaseSlotLocked(uint64_t id) {
  auto it = watched_.find(id);
  if (it == watched_.end()) return;
  if (words_ != nullptr && it->second.slot.region_id == words_region_) {
    free_slots_.push_back(it->second.slot.index);
  }
  watched_.erase(it);
}

bool CompletionTable::LookWordLocked(uint64_t id) {
  auto it = watched_.find(id);
  if (it == watched_.end() || !pending_.contains(id)) return false;
  // Acquire: the transfer's bytes, which the GPU made visible before the word, are seen after.
  if (__atomic_load_n(it->second.word, __ATOMIC_ACQUIRE) != it->second.slot.value) {
    return false;
  }
  wire::Completion c;
  c.flags = wire::kCompletionHasMore | kSeenInWord;  // the full status is the daemon's
  c.transfer_id = id;
  c.state = 3;  // TRANSFER_STATE_SUCCEEDED
  c.bytes_total = it->second.bytes_total;
  c.bytes_done = it->second.bytes_total;
  ++word_hits_;
  Remember(c);  // releases the slot: its word is written once per transfer, and was
  changed_.SignalAll();
  return true;
}

bool CompletionTable::Follows(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return pending_.contains(id) || done_.contains(id);
}

void CompletionTable::Remember(const wire::Completion& completion) {
  ReleaseSlotLocked(completion.transfer_id);
  // The daemon's entry after the word's: it replaces it (authoritative) but is not news.
  const bool fresh = pending_.contains(completion.transfer_id) ||
                     unsure_.contains(completion.transfer_id) ||
                     !done_.contains(completion.transfer_id);
  if (armed_ && fresh) fresh_.push_back(completion.transfer_id);
  pending_.erase(completion.transfer_id);
  unsure_.erase(completion.transfer_id);
  if (done_.insert_or_assign(completion.transfer_id, completion).second) {
    done_order_.push_back(completion.transfer_id);
    if (done_order_.size() > kRememberedEnds) {
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
  LookWordLocked(id);
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
  LookWordLocked(id);
  DrainLocked();
  return LookLocked(id);
}

void CompletionTable::States(const uint64_t* ids, size_t count, int32_t* states) {
  absl::MutexLock lock(&mu_);
  // The words first: an end already in its word is the word's (the daemon's entry follows it).
  for (size_t i = 0; i < count; ++i) LookWordLocked(ids[i]);
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
  const absl::Time started = absl::Now();
  const absl::Time spin_until = std::min(deadline, started + spin_);
  bool spun = false;
  while (spin_ > absl::ZeroDuration() && absl::Now() < spin_until) {
    spun = true;
    bool keep_spinning = true;
    if (!ring_->view().Ready()) {
      // Other threads may drain meanwhile: the lock is let go between looks.
      // Past its first microseconds the spin yields its CPU (base/spin_pause.h): the thread
      // that ends the transfer may be waiting for this very CPU. Where the CPU is contended
      // the spin stops and the thread sleeps on the eventfd below: the daemon's wake-up lets
      // the scheduler run it, where a yield would leave it behind another thread's slice.
      mu_.Unlock();
      keep_spinning = SpinPause(absl::Now() - started);
      mu_.Lock();
    }
    DrainLocked();
    result = LookLocked(id);
    if (result.outcome != Outcome::kTimeout) {
      ++spin_hits_;
      spin_ = max_spin_;  // it paid: keep the full spin
      return result;
    }
    if (!keep_spinning) break;
  }
  while (true) {
    DrainLocked();
    result = LookLocked(id);
    const absl::Time now = absl::Now();
    if (result.outcome != Outcome::kTimeout) {
      // The spin missed. NextSpin: full again when the end came within the longest spin (a full
      // one would have caught it), halved when it took longer.
      if (spun) spin_ = NextSpin(max_spin_, spin_, now - started);
      return result;
    }
    if (now >= deadline) {
      if (spun) spin_ = std::max(spin_ / 2, max_spin_ / 8);
      return result;
    }
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

uint64_t CompletionTable::word_hits() const {
  absl::MutexLock lock(&mu_);
  return word_hits_;
}

size_t CompletionTable::free_done_slots() const {
  absl::MutexLock lock(&mu_);
  return free_slots_.size();
}

size_t CompletionTable::remembered_capacity() const {
  absl::MutexLock lock(&mu_);
  return done_.capacity();
}

uint64_t CompletionTable::spin_hits() const {
  absl::MutexLock lock(&mu_);
  return spin_hits_;
}

}  // namespace kvrail::client
