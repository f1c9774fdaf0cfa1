// Internal to the session server: the daemon's end of a session's submission queue
// (wire/submission_queue.h). The poll thread takes the entries the client published - copied out
// of shared memory, each either a request's bytes or the refusal naming its bad field - and
// whoever admits them posts one acknowledgement per entry into the acknowledgement ring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "daemon/session/session_sinks.h"
#include "wire/shm_ring.h"
#include "wire/submission_queue.h"

namespace kvrail::session {

// Thread contract: Take, Ready, SetNeedWake and DrainWakes are the submission ring's consumer:
// one thread at a time (the poll thread). PostAck may be called from any thread (RingProducer
// serialises the acknowledgement ring's producers). The descriptors are immutable.
class SubmissionIntake {
 public:
  // Maps the client's rings: `fds` is the "SQ" packet's four descriptors (submission memfd and
  // eventfd, acknowledgement memfd and eventfd). INVALID_ARGUMENT naming the descriptor
  // (sq ring / ack ring) that is not what it should be.
  static absl::StatusOr<std::unique_ptr<SubmissionIntake>> Attach(std::vector<UniqueFd> fds);

  // One entry taken: its slots copied out of shared memory once (what is checked is what is
  // used), and either the request's bytes (payload()) or the refusal naming the bad field.
  struct Entry {
    uint64_t tag = 0;
    uint16_t kind = 0;     // the header's (wire::kSubmissionKind, kPostKind)
    absl::Status refused;  // OK when payload() is a request's bytes
    std::string bytes;     // the whole entry, header included
    uint32_t payload_bytes = 0;
    absl::string_view payload() const {
      return absl::string_view(bytes).substr(wire::kSubmissionHeaderBytes, payload_bytes);
    }
  };
  // Takes up to `max` published entries into `out`. DATA_LOSS when the ring's indices are
  // impossible: nothing more is ever taken from it (broken() from then on).
  absl::Status Take(size_t max, std::vector<Entry>* out);
  bool Ready() const { return !broken_ && sq_->view().Ready(); }
  bool broken() const { return broken_; }
  void SetNeedWake(bool sleeping) { sq_->view().SetNeedWake(sleeping); }
  void DrainWakes() const { sq_->DrainWakes(); }

  // Posts `ack` and rings the client's eventfd when it sleeps. A full ring (a client that keeps
  // more entries in flight than its acknowledgement ring holds) loses the acknowledgement: it is
  // counted in the ring's overflow word, and the transfer runs regardless.
  void PostAck(const wire::SubmitAck& ack);

  int sq_memfd() const { return sq_->memfd(); }
  int sq_eventfd() const { return sq_->eventfd(); }
  int ack_memfd() const { return ack_.memfd(); }
  int ack_eventfd() const { return ack_.eventfd(); }

 private:
  SubmissionIntake(std::unique_ptr<wire::SharedRing> sq, std::unique_ptr<wire::SharedRing> ack)
      : sq_(std::move(sq)),
        ack_(std::move(ack), "submission queue: ack ring",
             "the transfer runs regardless (the client keeps more entries in flight than its "
             "ack ring holds, or broke the ring)") {}

  const std::unique_ptr<wire::SharedRing> sq_;  // consumer's side: the poll thread's
  bool broken_ = false;                         // the poll thread's
  RingProducer ack_;                            // thread-safe
};

// The submission queues of the poll thread's sessions: which to look at now, and the adaptive
// spin (SessionServerOptions::submission_spin) on each after it had entries: while spinning, a
// queue's need_wake is clear and the poll thread looks at it every round; when its spin runs out
// it goes back to sleep (need_wake set, then one more look, so that an entry published meanwhile
// is taken now, not missed), and its next spin is halved (down to an eighth) unless it found
// entries while spinning (then full again). Entries that wake a sleeping queue within the full
// spin's length of its last spin's start make the next spin full again (NextSpin): a full spin
// would have caught them, where a short one never could.
// Thread contract: the poll thread's only (a hot restart's ExportState reads intakes while it
// is stopped).
class SubmissionQueues {
 public:
  explicit SubmissionQueues(absl::Duration max_spin) : max_spin_(max_spin) {}

  // Starts watching the queue of connection `key` (its fd number): looked at in the next round.
  void Add(int key, std::shared_ptr<SubmissionIntake> intake);
  void Remove(int key);
  // `key`'s eventfd rang: looked at in the next round.
  void Woken(int key);
  // Whether the poll thread must not sleep: a queue to look at, or spinning.
  bool Busy() const { return !due_.empty() || !spinning_.empty(); }
  // Whether a queue is spinning (the poll thread polls it without a wake-up), and whether one
  // is due (its eventfd rang, or it had more than one look's worth).
  bool Spinning() const { return !spinning_.empty(); }
  bool Due() const { return !due_.empty(); }

  // One round: takes the entries of every queue that is due or spinning with entries ready
  // (at most `max` per queue) and calls admit(key, entries) for each non-empty take.
  // broken(key, status) for a queue whose indices became impossible (no longer read).
  // `may_spin` false (the spin budget is spent): no spin starts and every spin ends now (each
  // queue back asleep with its last look). Returns whether any entries were taken.
  // Predictive wake: every queue not spinning spins from `now` until `until` (need_wake clear,
  // looked at every round) as after a take, except that its end does not shorten the queue's
  // next spin. Entries published before need_wake cleared rang the eventfd (Woken).
  void SpinUntil(absl::Time now, absl::Time until);
  bool Look(size_t max, bool may_spin,
            const std::function<void(int key, std::vector<SubmissionIntake::Entry> entries)>& admit,
            const std::function<void(int key, const absl::Status& status)>& broken);

 private:
  struct Queue {
    std::shared_ptr<SubmissionIntake> intake;
    absl::Duration budget;                      // the next spin's length
    absl::Time until;                           // while spinning
    absl::Time spun_at = absl::InfinitePast();  // when the last spin began
    bool hit = false;                           // found entries during this spin
    bool predicted = false;                     // this spin is predictive wake's (SpinUntil)
  };
  // A spinning queue had entries: its spin goes on (full length after a take, its adaptive
  // length after predictive wake's spin found them).
  void FoundWhileSpinning(Queue& queue, absl::Time now) const;
  // Takes from `queue`; true when entries came.
  bool TakeFrom(int key, Queue& queue, size_t max,
                const std::function<void(int, std::vector<SubmissionIntake::Entry>)>& admit,
                const std::function<void(int, const absl::Status&)>& broken);

  const absl::Duration max_spin_;
  absl::flat_hash_map<int, Queue> queues_;
  std::vector<int> due_;               // looked at in the next round
  absl::flat_hash_set<int> spinning_;  // need_wake clear
};

}  // namespace kvrail::session
