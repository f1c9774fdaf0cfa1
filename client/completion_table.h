// The client's end of a session's completion queue (wire/shm_ring.h): kvraild posts the final
// state of each transfer the session submitted over the session socket; this table drains the
// ring into a map so that Wait, a batch of states and an event loop read them without a call.
// Internal to the client library (kvrail_client.h is its public face).
//
// A full ring (or a ring the daemon could not use) moves the ring's overflow word: every
// followed transfer still pending then becomes "unsure" and its caller reads the state the old
// way (WAIT / GetTransfer), then Resolve()s it. Nothing is lost: the daemon keeps the record.
//
// The GPU-written completion (TransferSpec.done_word; docs/architecture.md, "GPU-written
// completion"): with done words enabled, a transfer followed with a slot is SUCCEEDED as soon as
// its slot's word holds the value it was given, before the daemon's entry comes. The words are
// shared memory this process can write itself, so a match only changes this table's view; a
// failed or cancelled transfer's word is never written and its end comes from the daemon, whose
// entry replaces the word's when it arrives. A slot goes back to the free list once its word was
// seen or the daemon's end came, whichever is first: the daemon's stream writes a slot at most
// once per transfer, before the daemon ends that transfer. Values are never reused, so a word
// left from an earlier transfer never matches a later one.
//
// Thread contract: thread-safe. Any number of threads may wait, read states and follow at once;
// one of the waiters at a time sleeps on the eventfd, the others on a condition variable, and
// whoever drains the ring wakes the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "wire/shm_ring.h"

namespace kvrail::client {

class CompletionTable {
 public:
  // A ring of `capacity` entries; waits poll the ring for up to `max_spin` before they sleep
  // (adaptive, NextSpin: full again after an end that came within `max_spin`, halved while ends
  // take longer; zero never spins).
  static absl::StatusOr<std::unique_ptr<CompletionTable>> Create(uint32_t capacity,
                                                                 absl::Duration max_spin);

  int memfd() const { return memfd_; }
  int eventfd() const { return eventfd_; }

  // The overflow count now; read before a submit and handed to Follow after it.
  uint64_t OverflowMark();
  // One transfer's done word: word `index` of the table (byte offset 8 * index in region
  // `region_id`), to hold `value` once the transfer's bytes landed.
  struct DoneSlot {
    uint32_t index = 0;
    uint64_t value = 0;
    uint64_t region_id = 0;
  };
  // Done words from now on: `count` 64-bit words at `words` (kept alive by the caller for the
  // table's life), in the daemon's region `region_id`. Called again when the words move to
  // another region: slots are taken there from then on; transfers still followed keep their
  // words in the old one (which the caller keeps alive too). nullptr: no slots from now on.
  void EnableDoneWords(uint64_t* words, uint32_t count, uint64_t region_id);
  // A free slot with a value never used before; nullopt when none is free (or not enabled).
  std::optional<DoneSlot> TakeDoneSlot();
  // A slot whose transfer was not followed (its submit failed or was deduplicated).
  void ReturnDoneSlot(const DoneSlot& slot);
  // Transfer `id` was submitted on the session: its completion comes through the ring. When the
  // ring overflowed since `mark`, its completion may have been missed: it is unsure at once.
  // `slot`: its done word (TakeDoneSlot), owned by the table from here on.
  void Follow(uint64_t id, uint64_t mark, std::optional<DoneSlot> slot = std::nullopt,
              uint64_t bytes_total = 0);
  // Whether `id` is followed (pending, or ended and still remembered).
  bool Follows(uint64_t id);

  // Result::completion.flags of an end seen in its done word (with wire::kCompletionHasMore: the
  // daemon's entry, when it comes, replaces it). A bit the daemon never sets.
  static constexpr uint32_t kSeenInWord = 1u << 31;

  enum class Outcome { kDone, kTimeout, kUnsure };
  struct Result {
    Outcome outcome = Outcome::kTimeout;
    wire::Completion completion;  // kDone
  };
  // Waits until `id`'s completion is in (kDone), `deadline` passes (kTimeout), or it became
  // unsure (read it the old way). `id` must be followed.
  Result Wait(uint64_t id, absl::Time deadline);
  // Without waiting: the completion when in, kUnsure, or kTimeout (still pending).
  Result Peek(uint64_t id);
  // One drain, then for each ids[i]: its final state when in, TRANSFER_STATE_RUNNING (2) when
  // pending and sure; states[i] is left as it is otherwise.
  void States(const uint64_t* ids, size_t count, int32_t* states);
  // The old way found `id` ended: remembered as if it came through the ring.
  void Resolve(const wire::Completion& completion);

  // An event loop sleeps on eventfd() instead of a waiter: while armed the daemon rings it for
  // every completion. Drain() then takes what came (and clears the eventfd); returns how many.
  void SetArmed(bool armed);
  size_t Drain();
  // While armed: the ids of transfers that ended (or became unsure) since the last call, at
  // most `max` of them into `ids` (the rest stay for the next call); drains the ring first.
  size_t TakeFresh(uint64_t* ids, size_t max);

  // Every pending transfer becomes unsure and waiters wake (the session is gone).
  void Abandon();

  // Ends remembered after their transfer ended (more than kvraild's default history of 10,000);
  // older ones are read the old way again. Their map is sized for this many when the table is
  // made and never grows: growing it rehashed every end at once in the middle of a wait (at the
  // 3,584th end of a session the 4 KiB transfer it fell on took 0.3-1.1 ms, the slowest of its
  // run; each doubling after it longer, up to the former bound of 2^18 ends).
  static constexpr size_t kRememberedEnds = size_t{1} << 14;

  // Counters for tests and benchmarks.
  uint64_t refused_entries() const;
  // The remembered ends' map's capacity (constant: it never rehashes).
  size_t remembered_capacity() const;
  uint64_t spin_hits() const;
  // Ends first seen in a done word, and slots free now.
  uint64_t word_hits() const;
  size_t free_done_slots() const;

 private:
  CompletionTable(std::unique_ptr<wire::SharedRing> ring, absl::Duration max_spin)
      : memfd_(ring->memfd()),
        eventfd_(ring->eventfd()),
        ring_(std::move(ring)),
        max_spin_(max_spin),
        spin_(max_spin) {}
  // Takes what the ring holds into done_; true when anything new came or became unsure.
  bool DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remember(const wire::Completion& completion) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Result LookLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `id`'s done word holds its value; remembers it SUCCEEDED then.
  bool LookWordLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseSlotLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Watched {
    DoneSlot slot;
    const uint64_t* word = nullptr;
    uint64_t bytes_total = 0;
  };
  void UpdateNeedWakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int memfd_;    // the ring's, immutable
  const int eventfd_;  // the ring's, immutable
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  const std::unique_ptr<wire::SharedRing> ring_ ABSL_PT_GUARDED_BY(mu_);
  const absl::Duration max_spin_;
  absl::Duration spin_ ABSL_GUARDED_BY(mu_);  // the adaptive spin, in [max_spin_ / 8, max_spin_]
  absl::flat_hash_map<uint64_t, wire::Completion> done_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> done_order_ ABSL_GUARDED_BY(mu_);  // oldest first, for the bound
  absl::flat_hash_set<uint64_t> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> unsure_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> fresh_ ABSL_GUARDED_BY(mu_);  // TakeFresh's, collected while armed
  uint64_t overflow_seen_ ABSL_GUARDED_BY(mu_) = 0;
  bool sleeper_ ABSL_GUARDED_BY(mu_) = false;  // a waiter sleeps on the eventfd
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // the ring's indices were impossible
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t taken_ ABSL_GUARDED_BY(mu_) = 0;  // ends read from the ring, ever
  uint64_t spin_hits_ ABSL_GUARDED_BY(mu_) = 0;
  // Done words (EnableDoneWords): the shared words, free slots, followed transfers' slots.
  uint64_t* words_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t words_region_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  uint64_t next_value_ ABSL_GUARDED_BY(mu_) = 0;  // random base, then counted up
  absl::flat_hash_map<uint64_t, Watched> watched_ ABSL_GUARDED_BY(mu_);
  uint64_t word_hits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvrail::client
