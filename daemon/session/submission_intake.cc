#include "daemon/session/submission_intake.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/spin_budget.h"
#include "spdlog/spdlog.h"

namespace kvrail::session {

absl::StatusOr<std::unique_ptr<SubmissionIntake>> SubmissionIntake::Attach(
    std::vector<UniqueFd> fds) {
  if (fds.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("SQ: ", fds.size(),
                     " descriptors, expected 4 (sq memfd, sq eventfd, ack "
                     "memfd, ack eventfd)"));
  }
  absl::StatusOr<std::unique_ptr<wire::SharedRing>> sq =
      wire::SharedRing::Attach(std::move(fds[0]), std::move(fds[1]), wire::kSubmissionSlotBytes);
  if (!sq.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("SQ: sq ring: ", sq.status().message()));
  }
  if ((*sq)->view().capacity() < 2 * wire::kMaxSubmissionSlots) {
    return absl::InvalidArgumentError(absl::StrCat("SQ: sq ring: capacity ",
                                                   (*sq)->view().capacity(), ", at least ",
                                                   2 * wire::kMaxSubmissionSlots));
  }
  absl::StatusOr<std::unique_ptr<wire::SharedRing>> ack =
      wire::SharedRing::Attach(std::move(fds[2]), std::move(fds[3]), wire::kSubmitAckBytes);
  if (!ack.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("SQ: ack ring: ", ack.status().message()));
  }
  return std::unique_ptr<SubmissionIntake>(new SubmissionIntake(*std::move(sq), *std::move(ack)));
}

absl::Status SubmissionIntake::Take(size_t max, std::vector<Entry>* out) {
  if (broken_) return absl::DataLossError("sq ring: broken");
  wire::RingView& ring = sq_->view();
  for (size_t n = 0; n < max; ++n) {
    absl::StatusOr<uint64_t> published = ring.Published();
    if (!published.ok()) {
      broken_ = true;
      return published.status();
    }
    if (*published == 0) break;
    // The header slot first; then the entry's span (the whole entry was published in one write,
    // or the header is garbled and taken alone). Each slot is copied out of shared memory once,
    // straight into the entry's bytes: what is checked is what is used.
    uint8_t first[wire::kSubmissionSlotBytes];
    (void)ring.Pop(
        1, [&first](const uint8_t* slot, size_t) { std::memcpy(first, slot, sizeof(first)); });
    const wire::SubmissionHeader header = wire::ReadSubmissionHeader(first);
    const uint32_t span = wire::SubmissionSpan(header, *published);
    Entry& taken = out->emplace_back();
    taken.tag = header.tag;
    taken.kind = header.kind;
    taken.bytes.resize(size_t{span} * wire::kSubmissionSlotBytes);
    char* at = taken.bytes.data();
    std::memcpy(at, first, sizeof(first));
    at += sizeof(first);
    if (span > 1) {
      (void)ring.Pop(span - 1, [&at](const uint8_t* slot, size_t bytes) {
        std::memcpy(at, slot, bytes);
        at += bytes;
      });
    }
    absl::StatusOr<absl::string_view> payload = wire::SubmissionPayload(
        reinterpret_cast<const uint8_t*>(taken.bytes.data()), taken.bytes.size());
    if (payload.ok()) {
      taken.payload_bytes = static_cast<uint32_t>(payload->size());
    } else {
      taken.refused = payload.status();
    }
  }
  return absl::OkStatus();
}

void SubmissionIntake::PostAck(const wire::SubmitAck& ack) {
  uint8_t entry[wire::kSubmitAckBytes];
  wire::EncodeSubmitAck(ack, entry);
  (void)ack_.Post(entry, sizeof(entry));
}

// --- SubmissionQueues ---------------------------------------------------------------------------

void SubmissionQueues::Add(int key, std::shared_ptr<SubmissionIntake> intake) {
  intake->SetNeedWake(true);
  Queue& queue = queues_[key];
  queue.intake = std::move(intake);
  queue.budget = max_spin_;
  due_.push_back(key);
}

void SubmissionQueues::Remove(int key) {
  queues_.erase(key);
  spinning_.erase(key);
}

void SubmissionQueues::Woken(int key) {
  auto it = queues_.find(key);
  if (it == queues_.end()) return;
  it->second.intake->DrainWakes();
  due_.push_back(key);
}

void SubmissionQueues::SpinUntil(absl::Time now, absl::Time until) {
  for (auto& [key, queue] : queues_) {
    if (queue.intake->broken() || !spinning_.insert(key).second) continue;
    queue.intake->SetNeedWake(false);
    queue.hit = false;
    queue.predicted = true;
    queue.until = std::max(now, until);
  }
}

void SubmissionQueues::FoundWhileSpinning(Queue& queue, absl::Time now) const {
  if (queue.predicted) {
    // The predicted entry came: what follows is the spin after a take at its adaptive length,
    // as after a wake-up (at a cadence it stays short: a long one would hold the CPU the client
    // may need for its own wake-up, and catch nothing).
    queue.predicted = false;
    queue.hit = false;
    queue.spun_at = now;
    queue.until = now + queue.budget;
    return;
  }
  queue.hit = true;
  queue.until = now + max_spin_;
}

bool SubmissionQueues::TakeFrom(
    int key, Queue& queue, size_t max,
    const std::function<void(int, std::vector<SubmissionIntake::Entry>)>& admit,
    const std::function<void(int, const absl::Status&)>& broken) {
  std::vector<SubmissionIntake::Entry> entries;
  const absl::Status taken = queue.intake->Take(max, &entries);
  const bool any = !entries.empty();
  if (any) admit(key, std::move(entries));
  if (!taken.ok()) broken(key, taken);
  return any;
}

bool SubmissionQueues::Look(
    size_t max, bool may_spin,
    const std::function<void(int, std::vector<SubmissionIntake::Entry>)>& admit,
    const std::function<void(int, const absl::Status&)>& broken) {
  std::vector<int> due;
  due.swap(due_);
  const absl::Time now = absl::Now();
  bool took = false;
  for (const int key : due) {
    auto it = queues_.find(key);
    if (it == queues_.end() || it->second.intake->broken()) continue;
    Queue& queue = it->second;
    const bool any = TakeFrom(key, queue, max, admit, broken);
    took = took || any;
    // Woken (not spinning): entries that a full spin from the last one's start would have found.
    if (any && !spinning_.contains(key)) {
      queue.budget = NextSpin(max_spin_, queue.budget, now - queue.spun_at);
    }
    if (queue.intake->broken()) {
      spinning_.erase(key);
      continue;
    }
    if (max_spin_ > absl::ZeroDuration() && (may_spin || spinning_.contains(key))) {
      if (spinning_.insert(key).second) {
        queue.intake->SetNeedWake(false);
        queue.hit = false;
        queue.spun_at = now;
        queue.until = now + queue.budget;
      } else if (any) {
        FoundWhileSpinning(queue, now);
      }
    } else if (queue.intake->Ready()) {
      due_.push_back(key);  // more than one look's worth: the next round
    }
  }
  std::vector<int> asleep;
  for (const int key : spinning_) {
    auto it = queues_.find(key);
    if (it == queues_.end()) {
      asleep.push_back(key);
      continue;
    }
    Queue& queue = it->second;
    // Looked at above (and taken again below only to end the spin).
    if (may_spin && std::find(due.begin(), due.end(), key) != due.end()) continue;
    if (queue.intake->Ready()) {
      if (TakeFrom(key, queue, max, admit, broken)) {
        took = true;
        FoundWhileSpinning(queue, now);
      }
      if (queue.intake->broken()) asleep.push_back(key);
      if (may_spin || queue.intake->broken()) continue;
    }
    if (may_spin && now < queue.until) continue;
    queue.intake->SetNeedWake(true);
    if (queue.intake->Ready()) {
      queue.intake->SetNeedWake(false);
      due_.push_back(key);
      continue;
    }
    // A predicted spin that missed says nothing of the spin after a take.
    if (!queue.predicted || queue.hit) {
      queue.budget = queue.hit ? max_spin_ : std::max(max_spin_ / 8, queue.budget / 2);
    }
    queue.predicted = false;
    asleep.push_back(key);
  }
  for (const int key : asleep) spinning_.erase(key);
  return took;
}

}  // namespace kvrail::session
