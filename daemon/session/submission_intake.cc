#include "daemon/session/submission_intake.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
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
  std::string entry;
  for (size_t n = 0; n < max; ++n) {
    absl::StatusOr<uint64_t> published = ring.Published();
    if (!published.ok()) {
      broken_ = true;
      return published.status();
    }
    if (*published == 0) break;
    // The header first; then the entry's span (the whole entry was published in one write, or
    // the header is garbled and taken alone). Each slot is copied out once: what is checked is
    // what is used.
    wire::SubmissionHeader header;
    entry.clear();
    auto copy = [&entry](const uint8_t* slot, size_t bytes) {
      entry.append(reinterpret_cast<const char*>(slot), bytes);
    };
    (void)ring.Pop(1, copy);
    header = wire::ReadSubmissionHeader(reinterpret_cast<const uint8_t*>(entry.data()));
    const uint32_t span = wire::SubmissionSpan(header, *published);
    if (span > 1) (void)ring.Pop(span - 1, copy);
    Entry taken;
    taken.tag = header.tag;
    taken.kind = header.kind;
    absl::StatusOr<absl::string_view> payload =
        wire::SubmissionPayload(reinterpret_cast<const uint8_t*>(entry.data()), entry.size());
    if (payload.ok()) {
      taken.request = std::string(*payload);
    } else {
      taken.request = payload.status();
    }
    out->push_back(std::move(taken));
  }
  return absl::OkStatus();
}

void SubmissionIntake::PostAck(const wire::SubmitAck& ack) {
  uint8_t entry[wire::kSubmitAckBytes];
  wire::EncodeSubmitAck(ack, entry);
  absl::MutexLock lock(&mu_);
  absl::Status pushed =
      ack_broken_ ? absl::DataLossError("broken") : ack_->view().TryPush(entry, sizeof(entry));
  if (absl::IsDataLoss(pushed) && !ack_broken_) {
    ack_broken_ = true;
    spdlog::warn("submission queue: ack ring: {}", std::string(pushed.message()));
  }
  if (!pushed.ok()) {
    if (acks_lost_++ == 0) {
      spdlog::warn(
          "submission queue: an acknowledgement did not fit (the client keeps more "
          "entries in flight than its ack ring holds); transfer {} runs regardless",
          ack.transfer_id);
    }
    ack_->view().AddOverflow();
  }
  if (!pushed.ok() || ack_->view().ConsumerSleeps()) ack_->Wake();
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

void SubmissionQueues::Look(
    size_t max, const std::function<void(int, std::vector<SubmissionIntake::Entry>)>& admit,
    const std::function<void(int, const absl::Status&)>& broken) {
  std::vector<int> due;
  due.swap(due_);
  const absl::Time now = absl::Now();
  for (const int key : due) {
    auto it = queues_.find(key);
    if (it == queues_.end() || it->second.intake->broken()) continue;
    Queue& queue = it->second;
    const bool any = TakeFrom(key, queue, max, admit, broken);
    if (queue.intake->broken()) {
      spinning_.erase(key);
      continue;
    }
    if (max_spin_ > absl::ZeroDuration()) {
      if (spinning_.insert(key).second) {
        queue.intake->SetNeedWake(false);
        queue.hit = false;
        queue.until = now + queue.budget;
      } else if (any) {
        queue.hit = true;
        queue.until = now + max_spin_;
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
    if (std::find(due.begin(), due.end(), key) != due.end()) continue;  // looked at above
    if (queue.intake->Ready()) {
      if (TakeFrom(key, queue, max, admit, broken)) {
        queue.hit = true;
        queue.until = now + max_spin_;
      }
      if (queue.intake->broken()) asleep.push_back(key);
      continue;
    }
    if (now < queue.until) continue;
    queue.intake->SetNeedWake(true);
    if (queue.intake->Ready()) {
      queue.intake->SetNeedWake(false);
      due_.push_back(key);
      continue;
    }
    queue.budget = queue.hit ? max_spin_ : std::max(max_spin_ / 8, queue.budget / 2);
    asleep.push_back(key);
  }
  for (const int key : asleep) spinning_.erase(key);
}

}  // namespace kvrail::session
