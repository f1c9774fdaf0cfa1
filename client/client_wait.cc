// Client's wait part (client_impl.h lists the parts): Wait and WaitEnd, read from the session's
// completion queue where it follows the transfer, else by a WAIT packet or WaitTransfer.
#include <utility>

#include "client/client_impl.h"
#include "client/completion_table.h"
#include "client/kvrail_client.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "wire/session_wire.h"

namespace kvrail::client {
namespace {

// Extra time given to WaitTransfer beyond its own timeout before the client's deadline fires.
constexpr absl::Duration kWaitSlack = absl::Seconds(10);

wire::Completion CompletionOf(const v1::TransferStatus& status) {
  wire::Completion c;
  c.flags = wire::kCompletionHasMore;  // the full status is the daemon's
  c.transfer_id = status.transfer_id();
  c.state = static_cast<int32_t>(status.state());
  c.error_code = status.error_code();
  c.bytes_total = status.bytes_total();
  c.bytes_done = status.bytes_done();
  c.finished_unix_us = status.finished_unix_us();
  return c;
}

// An end the queue holds whole as WaitEnd returns it: the daemon's entry with nothing more to
// say, or one seen in its done word (the daemon's entry, with any more, follows).
bool IsWhole(const wire::Completion& completion) {
  return (completion.flags & wire::kCompletionHasMore) == 0 ||
         (completion.flags & CompletionTable::kSeenInWord) != 0;
}

v1::TransferStatus StatusOfEnd(const wire::Completion& completion) {
  v1::TransferStatus status;
  status.set_transfer_id(completion.transfer_id);
  status.set_state(static_cast<v1::TransferState>(completion.state));
  status.set_error_code(completion.error_code);
  status.set_bytes_total(completion.bytes_total);
  status.set_bytes_done(completion.bytes_done);
  status.set_finished_unix_us(completion.finished_unix_us);
  return status;
}

}  // namespace

absl::StatusOr<v1::TransferStatus> Client::Wait(uint64_t transfer_id, absl::Duration timeout) {
  // A transfer submitted on the session with a completion queue: its end is read locally.
  CompletionTable* completions = impl_->completions_.load();
  if (completions == nullptr || !completions->Follows(transfer_id)) {
    return WaitByCall(transfer_id, timeout);
  }
  const bool bounded = timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration();
  const CompletionTable::Result seen =
      completions->Wait(transfer_id, bounded ? absl::Now() + timeout : absl::InfiniteFuture());
  switch (seen.outcome) {
    case CompletionTable::Outcome::kDone:
      // Wait's contract is the transfer's whole status (path, engine, link, phases, layers), as
      // WaitTransfer answers it; the queue's entry holds only the state and counts. The transfer
      // has ended, so the call below is answered at once. Callers that need only the end read
      // it locally, without a call: LocalStates (done, poll, batch status) and the eventfd.
      return WaitByCall(transfer_id, timeout);
    case CompletionTable::Outcome::kTimeout:
      return Get(transfer_id);
    case CompletionTable::Outcome::kUnsure:
      break;
  }
  // The queue overflowed (or the session went): the old way, remembered for the next reader.
  absl::StatusOr<v1::TransferStatus> status = WaitByCall(transfer_id, timeout);
  if (status.ok() && IsFinal(status->state())) completions->Resolve(CompletionOf(*status));
  return status;
}

absl::StatusOr<v1::TransferStatus> Client::WaitEnd(uint64_t transfer_id, absl::Duration timeout) {
  CompletionTable* completions = impl_->completions_.load();
  if (completions == nullptr || !completions->Follows(transfer_id)) {
    return Wait(transfer_id, timeout);
  }
  const bool bounded = timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration();
  const CompletionTable::Result seen =
      completions->Wait(transfer_id, bounded ? absl::Now() + timeout : absl::InfiniteFuture());
  if (seen.outcome == CompletionTable::Outcome::kTimeout) return Get(transfer_id);
  if (seen.outcome == CompletionTable::Outcome::kDone && IsWhole(seen.completion)) {
    return StatusOfEnd(seen.completion);
  }
  // Missed by the queue, or more than the entry holds: the whole status (at once when ended).
  return Wait(transfer_id, timeout);
}

std::optional<v1::TransferStatus> Client::EndIfSeen(uint64_t transfer_id) {
  CompletionTable* completions = impl_->completions_.load();
  if (completions == nullptr) return std::nullopt;
  const CompletionTable::Result seen = completions->Peek(transfer_id);
  if (seen.outcome != CompletionTable::Outcome::kDone || !IsWhole(seen.completion)) {
    return std::nullopt;
  }
  return StatusOfEnd(seen.completion);
}

void Client::LocalStates(const uint64_t* ids, size_t count, int32_t* states) {
  CompletionTable* completions = impl_->completions_.load();
  for (size_t i = 0; i < count; ++i) states[i] = v1::TRANSFER_STATE_UNSPECIFIED;
  if (completions != nullptr) completions->States(ids, count, states);
}

uint64_t Client::DoneWordHits() {
  absl::MutexLock lock(&impl_->session_mu_);
  uint64_t hits = 0;
  for (const auto& table : impl_->tables_) hits += table->word_hits();
  return hits;
}

int Client::CompletionFd() {
  CompletionTable* completions = impl_->completions_.load();
  return completions != nullptr ? completions->eventfd() : -1;
}

size_t Client::TakeCompletions(uint64_t* ids, size_t max) {
  CompletionTable* completions = impl_->completions_.load();
  return completions != nullptr ? completions->TakeFresh(ids, max) : 0;
}

bool Client::FollowsCompletion(uint64_t transfer_id) {
  CompletionTable* completions = impl_->completions_.load();
  return completions != nullptr && completions->Follows(transfer_id);
}

void Client::ArmCompletions(bool armed) {
  if (CompletionTable* completions = impl_->completions_.load()) {
    completions->SetArmed(armed);
    completions->Drain();
  }
}

absl::StatusOr<v1::TransferStatus> Client::WaitByCall(uint64_t transfer_id,
                                                      absl::Duration timeout) {
  // A WAIT on a session connection: the final status, the daemon's error, the current status when
  // a bounded wait times out; anything else (no session, an older daemon, a broken connection)
  // asks over gRPC below, where waiting again is harmless.
  if (impl_->session_submit_.load() && !impl_->unix_path_.empty()) {
    const bool bounded = timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration();
    if (auto conn = impl_->TakeWaitConnection(); conn != nullptr) {
      conn->SetAnswerTimeout(bounded ? timeout : absl::InfiniteDuration());
      bool sent = false;
      // As the main session: only a transfer's submitter may wait for it.
      absl::StatusOr<std::string> answer =
          conn->Exchange(wire::EncodeWait(transfer_id, impl_->Credential()), &sent);
      if (!answer.ok()) {
        // A DONE may still come on this connection: it is not reused.
        if (bounded && answer.status().code() == absl::StatusCode::kDeadlineExceeded) {
          return Get(transfer_id);
        }
      } else {
        // DONE, or the daemon's REJECTED: the connection is free again. An unparsable DONE asks
        // over gRPC below; any other answer (or REJECTED UNIMPLEMENTED) is an older daemon.
        absl::StatusOr<v1::TransferStatus> done = wire::ParseDoneAnswer(*answer);
        const bool rejected = wire::ParseRejected(*answer).has_value();
        if (done.ok() || (rejected && done.status().code() != absl::StatusCode::kUnimplemented)) {
          impl_->ReturnWaitConnection(std::move(conn));
          return impl_->Checked(std::move(done));
        }
        if (done.status().code() == absl::StatusCode::kUnimplemented) {
          impl_->session_submit_.store(false);  // an older daemon: gRPC from now on
        }
      }
    }
  }
  v1::WaitTransferRequest request;
  request.set_transfer_id(transfer_id);
  absl::Duration deadline = absl::InfiniteDuration();
  if (timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration()) {
    // Round up so that a sub-millisecond timeout does not become "forever" (0).
    request.set_timeout_ms(static_cast<uint64_t>(
        absl::ToInt64Milliseconds(timeout + absl::Milliseconds(1) - absl::Nanoseconds(1))));
    deadline = timeout + kWaitSlack;
  }
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::WaitTransfer, request, deadline);
}

}  // namespace kvrail::client
