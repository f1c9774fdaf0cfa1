// The client's end of a session's submission queue (wire/submission_queue.h): transfer requests
// are written into a ring kvraild reads - a batch in one write, one publish - and each is
// answered by an acknowledgement in a second ring (the transfer's id, or the refusal), so that a
// submit costs no socket round trip. Internal to the client library (kvrail_client.h is its
// public face).
//
// A request that cannot go this way - larger than one entry, more than the queue has room for,
// or more in flight than the acknowledgement ring holds - is handed back unqueued: the caller
// sends it as a SUBMIT packet. Nothing is dropped.
//
// Thread contract: thread-safe. Any number of threads may submit at once: writing is serialised,
// and of the threads waiting for acknowledgements one at a time sleeps on the eventfd, the
// others on a condition variable; whoever reads the ring wakes the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "google/protobuf/message_lite.h"
#include "proto/kvrail/v1/transfer.pb.h"
#include "wire/shm_ring.h"
#include "wire/submission_queue.h"

namespace kvrail::client {

class SubmissionQueue {
 public:
  // A submission ring of `slots` slots (a power of 2, at least 128) and an acknowledgement ring
  // of a quarter as many entries (at least 32: the most requests in flight at once). Waits for
  // acknowledgements poll for up to `max_spin` before they sleep (adaptive, NextSpin: full again
  // after acknowledgements that came within `max_spin`, halved down to an eighth while they take
  // longer; zero never spins).
  static absl::StatusOr<std::unique_ptr<SubmissionQueue>> Create(uint32_t slots,
                                                                 absl::Duration max_spin);

  // The four descriptors of the "SQ" packet (owned here).
  int sq_memfd() const { return sq_->memfd(); }
  int sq_eventfd() const { return sq_->eventfd(); }
  int ack_memfd() const { return ack_->memfd(); }
  int ack_eventfd() const { return ack_->eventfd(); }

  // What became of one request: not queued (send it by packet), or the daemon's answer.
  struct Result {
    bool queued = false;
    // Meaningful when queued (no message allocated for the others).
    absl::StatusOr<v1::SubmitTransferResponse> response =
        absl::Status(absl::StatusCode::kUnknown, "");
  };
  // A batch's results; one or a few requests need no allocation for it.
  using Results = absl::InlinedVector<Result, 4>;
  // Writes the requests that fit as one batch (one publish; requests[i] must not be null) and
  // waits for their acknowledgements. `closed` is asked while waiting: once it says the session
  // is gone, a request still unanswered is UNAVAILABLE (the daemon may have accepted it: it is
  // not sent again). Results are in the order of `requests`.
  Results Submit(absl::Span<const v1::SubmitTransferRequest* const> requests,
                 const std::function<bool()>& closed);
  // One prepared transfer's post (a wire::kPostKind entry), queued and answered as a request.
  Result Post(const v1::PostTransferRequest& post, const std::function<bool()>& closed);

  // Counters for tests and benchmarks: requests queued, requests handed back unqueued,
  // acknowledgements refused as malformed, and waits that ended while spinning.
  uint64_t queued() const;
  uint64_t handed_back() const;
  uint64_t refused_acks() const;
  uint64_t spin_hits() const;

 private:
  SubmissionQueue(std::unique_ptr<wire::SharedRing> sq, std::unique_ptr<wire::SharedRing> ack,
                  absl::Duration max_spin)
      : sq_(std::move(sq)), ack_(std::move(ack)), max_spin_(max_spin), spin_(max_spin) {}
  // Submit's work over messages written as entries of kind `kind`, each serialized in place
  // behind its header (one too big for an entry is handed back).
  Results SubmitMessages(uint16_t kind,
                         absl::Span<const google::protobuf::MessageLite* const> messages,
                         const std::function<bool()>& closed);
  // Reads what the acknowledgement ring holds into acks_.
  void DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every tag in `tags` (0: not queued) has its acknowledgement.
  bool AllInLocked(absl::Span<const uint64_t> tags) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The rings' objects are immutable; their views follow RingView's contract under mu_.
  const std::unique_ptr<wire::SharedRing> sq_;
  const std::unique_ptr<wire::SharedRing> ack_;
  const absl::Duration max_spin_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  absl::Duration spin_ ABSL_GUARDED_BY(mu_);
  uint64_t next_tag_ ABSL_GUARDED_BY(mu_) = 1;
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // queued, not acknowledged
  absl::flat_hash_map<uint64_t, wire::SubmitAck> acks_ ABSL_GUARDED_BY(mu_);
  bool sleeper_ ABSL_GUARDED_BY(mu_) = false;  // a waiter sleeps on the eventfd
  bool broken_ ABSL_GUARDED_BY(mu_) = false;   // a ring's indices were impossible
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t handed_back_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t spin_hits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvrail::client
