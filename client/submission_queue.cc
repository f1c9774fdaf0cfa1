#include "client/submission_queue.h"

#include <poll.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/spin_budget.h"
#include "base/spin_pause.h"

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

bool SubmissionQueue::AllInLocked(absl::Span<const uint64_t> tags) const {
  for (const uint64_t tag : tags) {
    if (tag != 0 && !acks_.contains(tag)) return false;
  }
  return true;
}

SubmissionQueue::Results SubmissionQueue::Submit(
    absl::Span<const v1::SubmitTransferRequest* const> requests,
    const std::function<bool()>& closed) {
  absl::InlinedVector<const google::protobuf::MessageLite*, 4> messages(requests.begin(),
                                                                        requests.end());
  return SubmitMessages(wire::kSubmissionKind, messages, closed);
}

SubmissionQueue::Result SubmissionQueue::Post(const v1::PostTransferRequest& post,
                                              const std::function<bool()>& closed) {
  const google::protobuf::MessageLite* message = &post;
  return std::move(SubmitMessages(wire::kPostKind, {&message, 1}, closed)[0]);
}

SubmissionQueue::Results SubmissionQueue::SubmitMessages(
    uint16_t kind, absl::Span<const google::protobuf::MessageLite* const> messages,
    const std::function<bool()>& closed) {
  Results results(messages.size());
  absl::InlinedVector<uint64_t, 4> tags(messages.size(), 0);
  // The entries, serialized in place behind their headers (a small request's entry is one or
  // two slots: no allocation beyond this buffer's).
  std::string bytes;
  absl::InlinedVector<size_t, 4> sizes(messages.size(), 0);
  size_t total = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    sizes[i] = messages[i]->ByteSizeLong();
    if (sizes[i] <= wire::kMaxSubmissionPayload) {
      total += size_t{wire::SubmissionSlots(sizes[i])} * wire::kSubmissionSlotBytes;
    }
  }
  bytes.reserve(total);
  absl::MutexLock lock(&mu_);
  // --- Write: the entries that fit, one publish (a prefix when the ring has less room).
  {
    absl::InlinedVector<size_t, 4> ends;  // bytes after each queued candidate
    absl::InlinedVector<size_t, 4> order;
    const size_t ack_room = broken_ ? 0
                                    : static_cast<size_t>(ack_->view().capacity()) -
                                          std::min<size_t>(in_flight_, ack_->view().capacity());
    for (size_t i = 0; i < messages.size() && order.size() < ack_room; ++i) {
      const uint64_t tag = next_tag_ + order.size();
      uint8_t* payload = wire::AppendSubmissionHeader(tag, sizes[i], &bytes, kind);
      if (payload == nullptr) continue;  // too big for an entry
      if (sizes[i] > 0) messages[i]->SerializeWithCachedSizesToArray(payload);
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
    handed_back_ += messages.size() - count;
    if (count > 0 && sq_->view().ConsumerSleeps()) sq_->Wake();
    if (count == 0) return results;
  }
  // --- Wait for the acknowledgements.
  const absl::Time waiting_since = absl::Now();
  const absl::Time spin_until = waiting_since + spin_;
  // The spin keeps its CPU for its first microseconds, then yields it; a contended CPU ends it
  // (SpinPause, base/spin_pause.h) and the thread sleeps on the acknowledgements' eventfd.
  bool spinning = true;
  for (;;) {
    DrainLocked();
    if (AllInLocked(tags) || broken_) break;
    if (spinning && absl::Now() < spin_until) {
      mu_.Unlock();
      spinning = SpinPause(absl::Now() - waiting_since);
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
  // Adaptive spin (NextSpin): full again when the acknowledgements came within the longest
  // spin, halved when they took longer.
  if (max_spin_ > absl::ZeroDuration()) {
    const absl::Time now = absl::Now();
    if (AllInLocked(tags) && now <= spin_until) ++spin_hits_;
    spin_ = AllInLocked(tags) ? NextSpin(max_spin_, spin_, now - waiting_since)
                              : std::max(max_spin_ / 8, spin_ / 2);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
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
