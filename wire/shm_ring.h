// A single-producer single-consumer ring of fixed-size entries in shared memory (a memfd mapped
// by the client and by kvraild), io_uring / NVMe style: the session's completion queue, on which
// kvraild posts each transfer's final state so that a client sees it without a call, and the
// submission queue's two rings (wire/submission_queue.h: the client produces, kvraild consumes).
//
// Memory layout (little endian, offsets in bytes; every index is a free-running uint64 count):
//     0  header: magic "KVRQ" (u32), version (u32), slot_bytes (u32), capacity (u32, a power of 2)
//    64  tail (u64): entries the producer has published; written by the producer only
//   128  head (u64): entries the consumer has taken; need_wake (u32): the consumer sleeps
//   192  overflow (u64): entries the producer could not post because the ring was full
//   256  capacity slots of slot_bytes; entry i lives in slot i % capacity
// Ordering rules (both sides follow them; docs/architecture.md, "Completion queue"):
//   - the producer writes the slot, then stores tail with release; the consumer loads tail with
//     acquire, then reads the slot: a published entry is complete when read;
//   - the consumer reads the slot, then stores head with release; the producer loads head with
//     acquire before it reuses the slot: a slot is never overwritten while being read;
//   - sleeping: the consumer stores need_wake = 1, issues a seq_cst fence, and looks at tail once
//     more before it sleeps on the eventfd; the producer stores tail, issues a seq_cst fence, and
//     then reads need_wake, ringing the eventfd when it is set (neither side misses the other);
//   - each side keeps its own index privately and never reads it back from shared memory: the
//     other side can write anything into the mapping, so every shared value it reads is checked
//     (tail - head within capacity, each entry's kind and size) and a bad one is refused without
//     touching memory outside the ring.
// A full ring is never a loss: the producer counts the entry in `overflow` and tells the consumer
// by its fallback (for the completion queue: the daemon keeps the transfer's record; the client
// reads it over the session socket once it sees overflow move).
//
// Thread contract: RingView is a view, not thread-safe; one producer and one consumer, each on
// one thread at a time (callers serialise their side). SharedRing's fds and mapping are
// immutable after creation; its view follows RingView's contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace kvrail::wire {

inline constexpr uint32_t kRingMagic = 0x5152564b;  // "KVRQ"
inline constexpr uint32_t kRingVersion = 1;
inline constexpr size_t kRingHeaderBytes = 256;
inline constexpr uint32_t kMinRingCapacity = 8;
inline constexpr uint32_t kMaxRingCapacity = 1u << 20;

// --- Completion entries ------------------------------------------------------------------------

// One 64-byte completion entry: the final state of one transfer of the session.
inline constexpr uint16_t kCompletionKind = 1;
inline constexpr uint32_t kCompletionEntryBytes = 64;
// flags: the final TransferStatus has more than the entry carries (an error message, a
// digest): a client that needs it reads the status itself.
inline constexpr uint32_t kCompletionHasMore = 1;
struct Completion {
  uint32_t flags = 0;        // kCompletionHasMore
  uint64_t tag = 0;          // the client's tag for the transfer (0: none)
  uint64_t transfer_id = 0;  // never 0
  int32_t state = 0;         // a final v1::TransferState (SUCCEEDED 3, FAILED 4, CANCELLED 5)
  int32_t error_code = 0;    // google.rpc.Code for FAILED / CANCELLED, else 0
  uint64_t bytes_total = 0;
  uint64_t bytes_done = 0;
  int64_t finished_unix_us = 0;
};
void EncodeCompletion(const Completion& completion, uint8_t out[kCompletionEntryBytes]);
// INVALID_ARGUMENT naming the field for an entry that is not a completion (kind, entry_bytes,
// transfer_id 0, a state that is not final, an error code outside 0..16).
absl::StatusOr<Completion> ParseCompletion(const uint8_t* bytes, size_t size);

// --- The ring over a mapping -------------------------------------------------------------------

// Bytes of a ring of `capacity` slots of `slot_bytes`.
size_t RingBytes(uint32_t capacity, uint32_t slot_bytes);

class RingView {
 public:
  // Writes an empty ring's header into `base` (RingBytes(capacity, slot_bytes) bytes, zeroed).
  // INVALID_ARGUMENT when capacity is not a power of 2 in [kMinRingCapacity, kMaxRingCapacity].
  static absl::StatusOr<RingView> Format(void* base, size_t bytes, uint32_t capacity,
                                         uint32_t slot_bytes);
  // A view of a ring the other side formatted: the header must name `slot_bytes` and a capacity
  // that fits `bytes`, and head and tail no more than capacity apart (the view starts at them).
  // The view keeps what it read; later changes to the header are ignored.
  static absl::StatusOr<RingView> Open(void* base, size_t bytes, uint32_t slot_bytes);

  uint32_t capacity() const { return capacity_; }
  uint32_t slot_bytes() const { return slot_bytes_; }

  // Producer. RESOURCE_EXHAUSTED when full; DATA_LOSS when the consumer's head is impossible
  // (behind tail by more than capacity, or ahead of it): the ring is broken, nothing is written.
  absl::Status TryPush(const uint8_t* entry, size_t size);
  // Writes `slots` consecutive slots from `bytes` (slots * slot_bytes bytes) and publishes them
  // with one store of tail: the consumer sees all of them or none. RESOURCE_EXHAUSTED when fewer
  // than `slots` are free (nothing is written); DATA_LOSS as TryPush.
  absl::Status TryPushSlots(const uint8_t* bytes, size_t slots);
  // Counts one entry that could not be posted (release).
  void AddOverflow();
  // After publishing: whether the consumer asked to be woken (seq_cst fence, then a load).
  bool ConsumerSleeps() const;

  // Consumer. Takes up to `max` published entries, calling `take(bytes, slot_bytes)` for each
  // (the bytes are in shared memory: copy and check them before use). DATA_LOSS when the
  // producer's tail is impossible (nothing is taken).
  template <typename Fn>
  absl::StatusOr<size_t> Pop(size_t max, Fn&& take);
  // Whether an entry is published and not yet taken (acquire).
  bool Ready() const;
  // Slots published and not yet taken (acquire); DATA_LOSS when the producer's tail is
  // impossible.
  absl::StatusOr<uint64_t> Published() const;
  // need_wake, with the seq_cst fence that orders it before the next look at tail.
  void SetNeedWake(bool sleeping);
  uint64_t overflow() const;
  uint64_t head() const { return head_; }

 private:
  RingView(uint8_t* base, uint32_t capacity, uint32_t slot_bytes)
      : base_(base), capacity_(capacity), slot_bytes_(slot_bytes) {}
  uint8_t* Slot(uint64_t index) const {
    return base_ + kRingHeaderBytes + (index & (capacity_ - 1)) * slot_bytes_;
  }
  // Loads tail (acquire); DATA_LOSS when it is impossible given head_.
  absl::StatusOr<uint64_t> LoadTail() const;
  // Producer: slots free for writing behind tail_ (loads head, acquire); DATA_LOSS when the
  // consumer's head is impossible.
  absl::StatusOr<uint64_t> FreeSlots() const;
  // Producer: the `slots` written behind tail_ become visible (release store of tail).
  void Publish(uint64_t slots);
  void StoreHead(uint64_t head);

  uint8_t* base_;
  uint32_t capacity_;
  uint32_t slot_bytes_;
  uint64_t head_ = 0;  // consumer's own head (never read back)
  uint64_t tail_ = 0;  // producer's own tail (never read back)
};

template <typename Fn>
absl::StatusOr<size_t> RingView::Pop(size_t max, Fn&& take) {
  absl::StatusOr<uint64_t> tail = LoadTail();
  if (!tail.ok()) return tail.status();
  size_t taken = 0;
  while (head_ != *tail && taken < max) {
    take(static_cast<const uint8_t*>(Slot(head_)), static_cast<size_t>(slot_bytes_));
    ++head_;
    ++taken;
  }
  if (taken > 0) StoreHead(head_);
  return taken;
}

// --- A ring in a memfd, with its eventfd -------------------------------------------------------

class SharedRing {
 public:
  // The consumer's side: a new sealed memfd (MFD_ALLOW_SEALING; shrinking and growing sealed)
  // holding an empty ring, and a non-blocking eventfd.
  // `name` labels the memfd (visible in /proc/PID/fd).
  static absl::StatusOr<std::unique_ptr<SharedRing>> Create(uint32_t capacity, uint32_t slot_bytes,
                                                            const char* name = "completion-queue");
  // The producer's side: maps `memfd` (which must be sealed against shrinking, or sealable: a
  // peer that could truncate it would crash this process with SIGBUS) and checks its header;
  // `eventfd` must be an eventfd. INVALID_ARGUMENT naming the descriptor otherwise.
  static absl::StatusOr<std::unique_ptr<SharedRing>> Attach(UniqueFd memfd, UniqueFd eventfd,
                                                            uint32_t slot_bytes);
  ~SharedRing();
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;

  RingView& view() { return view_; }
  int memfd() const { return memfd_.get(); }
  int eventfd() const { return eventfd_.get(); }
  // Rings the eventfd (the producer, when ConsumerSleeps()).
  void Wake() const;
  // Clears the eventfd's count without blocking (the consumer, after it woke).
  void DrainWakes() const;

 private:
  SharedRing(UniqueFd memfd, UniqueFd eventfd, void* map, size_t bytes, RingView view)
      : memfd_(std::move(memfd)),
        eventfd_(std::move(eventfd)),
        map_(map),
        bytes_(bytes),
        view_(view) {}
  UniqueFd memfd_;
  UniqueFd eventfd_;
  void* map_;
  size_t bytes_;
  RingView view_;
};

}  // namespace kvrail::wire
