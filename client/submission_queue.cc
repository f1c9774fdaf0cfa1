#include "client/submission_queue.h"

#include <poll.h>

#include <algorithm>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvrail::client {

absl::StatusOr<std::unique_ptr<SubmissionQueue>> SubmissionQueue::Create(uint32_t slots,
                                                                         absl::Duration max_spin) {
  if (slots < 2 * wire::kMaxSubmissionSlots) {
    return absl::InvalidArgumentError(absl::StrCat("submission queue slots: ", slots, ", at least ",
                                                   2 * wire::kMaxSubmissionSlots));
  }
  absl::StatusOr<std::unique_ptr<wire::SharedRing>> sq =
      wire::SharedRing::Create(slots, wire::kSubmissionSlotBytes, "submission-queue");
  if (!sq.ok()) return sq.status();
  // A quarter as many acknowledgements as slots (at least 32): the entries in flight at once.
  absl::StatusOr<std::unique_ptr<wire::SharedRing>> ack = wire::SharedRing::Create(
      std::max<uint32_t>(slots / 4, 32), wire::kSubmitAckBytes, "submission-acks");
  if (!ack.ok()) return ack.status();
  // The daemon's resting state: it sleeps until told otherwise (it clears need_wake while it
  // looks at the queue).
  (*sq)->view().SetNeedWake(true);
  return std::unique_ptr<SubmissionQueue>(new SubmissionQueue(
      *std::move(sq), *std::move(ack), std::max(max_spin, absl::ZeroDuration())));
}

void SubmissionQueue::DrainLocked() {
  if (broken_) return;
  absl::StatusOr<size_t> taken = ack_->view().Pop(
      ~size_t{0}, [this](const uint8_t* bytes, size_t size) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        absl::StatusOr<wire::SubmitAck> ack = wire::ParseSubmitAck(bytes, size);
        if (!ack.ok()) {
          ++refused_;
          return;
        }
        acks_[ack->tag] = *std::move(ack);
      });
  if (!taken.ok()) broken_ = true;
}

bool SubmissionQueue::AllInLocked(const std::vector<uint64_t>& tags) const {
  for (const uint64_t tag : tags) {
    if (tag != 0 && !acks_.contains(tag)) return false;
  }
  return true;
}

std::vector<SubmissionQueue::Result> SubmissionQueue::Submit(
    const std::vector<const v1::SubmitTransferRequest*>& requests,
    const std::function<bool()>& closed) {
  std::vector<std::string> payloads(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i]->ByteSizeLong() <= wire::kMaxSubmissionPayload) {
      requests[i]->SerializeToString(&payloads[i]);
    }
  }
  std::vector<bool> fits(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    fits[i] = !payloads[i].empty() || requests[i]->ByteSizeLong() == 0;
  }
  return SubmitPayloads(wire::kSubmissionKind, payloads, fits, closed);
}

SubmissionQueue::Result SubmissionQueue::Post(const v1::PostTransferRequest& post,
                                              const std::function<bool()>& closed) {
  std::vector<std::string> payloads(1);
  const bool fits = post.ByteSizeLong() <= wire::kMaxSubmissionPayload;
  if (fits) post.SerializeToString(&payloads[0]);
  return std::move(SubmitPayloads(wire::kPostKind, payloads, {fits}, closed)[0]);
}

std::vector<SubmissionQueue::Result> SubmissionQueue::SubmitPayloads(
    uint16_t kind, const std::vector<std::string>& payloads, const std::vector<bool>& fits,
    const std::function<bool()>& closed) {
  std::vector<Result> results(payloads.size());
  std::vector<uint64_t> tags(payloads.size(), 0);
  absl::MutexLock lock(&mu_);
  // --- Write: the entries that fit, one publish (a prefix when the ring has less room).
  {
    std::string bytes;
    std::vector<size_t> ends;  // bytes after each queued candidate
    std::vector<size_t> order;
    const size_t ack_room = broken_ ? 0
                                    : static_cast<size_t>(ack_->view().capacity()) -
                                          std::min<size_t>(in_flight_, ack_->view().capacity());
    for (size_t i = 0; i < payloads.size() && order.size() < ack_room; ++i) {
      if (!fits[i]) continue;  // too big
      const uint64_t tag = next_tag_ + order.size();
      if (!wire::AppendSubmission(tag, payloads[i], &bytes, kind).ok()) continue;
      order.push_back(i);
      ends.push_back(bytes.size());
    }
    size_t count = order.size();
    while (count > 0) {
      const absl::Status pushed =
          sq_->view().TryPushSlots(reinterpret_cast<const uint8_t*>(bytes.data()),
                                   ends[count - 1] / wire::kSubmissionSlotBytes);
      if (pushed.ok()) break;
      if (!absl::IsResourceExhausted(pushed)) {
        broken_ = true;  // the daemon's head is impossible: packets from now on
        count = 0;
        break;
      }
      count = count * 3 / 4;  // less room than the batch: a shorter prefix
    }
    for (size_t k = 0; k < count; ++k) {
      tags[order[k]] = next_tag_ + k;
      results[order[k]].queued = true;
    }
    next_tag_ += order.size();
    in_flight_ += count;
    queued_ += count;
    handed_back_ += payloads.size() - count;
    if (count > 0 && sq_->view().ConsumerSleeps()) sq_->Wake();
    if (count == 0) return results;
  }
  // --- Wait for the acknowledgements.
  const absl::Time spin_until = absl::Now() + spin_;
  for (;;) {
    DrainLocked();
    if (AllInLocked(tags) || broken_) break;
    if (absl::Now() < spin_until) {
      mu_.Unlock();
      std::this_thread::yield();
      mu_.Lock();
      continue;
    }
    if (sleeper_) {
      changed_.WaitWithTimeout(&mu_, absl::Milliseconds(10));
    } else {
      sleeper_ = true;
      ack_->view().SetNeedWake(true);
      DrainLocked();
      if (!AllInLocked(tags)) {
        mu_.Unlock();
        pollfd pfd{ack_->eventfd(), POLLIN, 0};
        (void)::poll(&pfd, 1, 50);
        mu_.Lock();
        ack_->DrainWakes();
      }
      ack_->view().SetNeedWake(false);
      sleeper_ = false;
      changed_.SignalAll();
    }
    if (AllInLocked(tags)) continue;
    if (closed && closed()) break;
  }
  // Adaptive spin: a wait answered while spinning keeps it full, one that had to sleep halves it.
  if (max_spin_ > absl::ZeroDuration()) {
    if (AllInLocked(tags) && absl::Now() <= spin_until) {
      ++spin_hits_;
      spin_ = max_spin_;
    } else {
      spin_ = std::max(max_spin_ / 8, spin_ / 2);
    }
  }
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (tags[i] == 0) continue;
    auto it = acks_.find(tags[i]);
    if (it == acks_.end()) {
      results[i].response = absl::UnavailableError(
          broken_ ? "submission queue: the acknowledgement ring is broken; the request may have "
                    "been accepted (look for it with ListTransfers)"
                  : "submission queue: the session closed before the request was acknowledged; "
                    "it may have been accepted");
      continue;
    }
    --in_flight_;
    const wire::SubmitAck& ack = it->second;
    if (ack.code != 0) {
      results[i].response = wire::SubmitAckStatus(ack);
    } else {
      v1::SubmitTransferResponse response;
      response.set_transfer_id(ack.transfer_id);
      response.set_deduplicated((ack.flags & wire::kSubmitAckDeduplicated) != 0);
      response.set_bytes_total(ack.bytes_total);
      response.set_tiles_total(ack.tiles_total);
      results[i].response = std::move(response);
    }
    acks_.erase(it);
  }
  return results;
}

uint64_t SubmissionQueue::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}
uint64_t SubmissionQueue::handed_back() const {
  absl::MutexLock lock(&mu_);
  return handed_back_;
}
uint64_t SubmissionQueue::refused_acks() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}
uint64_t SubmissionQueue::spin_hits() const {
  absl::MutexLock lock(&mu_);
  return spin_hits_;
}

}  // namespace kvrail::client
