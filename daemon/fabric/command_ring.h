// Internal to the fabric module: the GPU/engine -> NIC proxy command ring and the staging slot
// credits.
//
// CommandRing: a ring of 32-byte kernels::NicCommand slots in one shared memory block (on a GPU
// machine the block is pinned and GPU-mapped; here it is plain mmap'ed host memory). Producers
// (the engine's packing threads, later the packing kernel) reserve a sequence number with an
// atomic add on `reserved`, write the command, and publish it by storing its epoch last (release).
// The one consumer (the NIC's proxy thread) waits for slot[seq % N].epoch == EpochOf(seq), takes
// the command and advances `consumed` (release), which returns the ring credit to producers.
// Epochs are lap numbers starting at 1 (zeroed memory is "empty"); counters only grow, nothing is
// ever reset, so a stale command from an earlier lap can never be taken for a new one.
//
// SlotCredits: staging slot s of a (peer, NIC) lane is used `used[s]` times by the sender; the
// receiver writes back (through RMA, into `credit[s]`) how many uses it has consumed. Slot s is
// free when credit[s] == used[s]. Again epochs only grow.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "kernels/device_abi.h"

namespace kvrail::fabric {

// NicCommand.opcode values.
inline constexpr uint32_t kOpNone = 0;
inline constexpr uint32_t kOpWriteTile = 1;

// The ring's shared header, one cache line per writer.
struct alignas(64) RingHeader {
  alignas(64) std::atomic<uint64_t> reserved;  // producers: next sequence number to hand out
  alignas(64) std::atomic<uint64_t> consumed;  // consumer: commands taken (the credit counter)
};

// Thread contract: any number of producer threads may call TryPush concurrently; exactly one
// consumer thread calls Poll/Pop. Capacity is a power of two.
class CommandRing {
 public:
  static absl::StatusOr<std::unique_ptr<CommandRing>> Create(uint32_t capacity);
  ~CommandRing();
  CommandRing(const CommandRing&) = delete;
  CommandRing& operator=(const CommandRing&) = delete;

  uint32_t capacity() const { return capacity_; }
  static uint32_t EpochOf(uint64_t seq, uint32_t capacity) {
    return static_cast<uint32_t>(seq / capacity) + 1;
  }

  // Copies `cmd` (its epoch is overwritten) into the ring. False when the ring is full (no
  // credit): the producer retries later. Never blocks.
  bool TryPush(const kernels::NicCommand& cmd);
  // The next published command, or nullopt when the next slot is not published yet.
  std::optional<kernels::NicCommand> Pop();
  // Commands reserved but not yet consumed (approximate under concurrency).
  uint64_t Pending() const;
  uint64_t consumed() const { return header_->consumed.load(std::memory_order_acquire); }

 private:
  CommandRing(void* memory, size_t bytes, uint32_t capacity);

  void* memory_;
  size_t bytes_;
  const uint32_t capacity_;
  RingHeader* header_;
  kernels::NicCommand* slots_;
};

// Per-lane staging slot accounting. Thread contract: Acquire/Release/IsFree are called by the
// lane's owner (under its lock); `credit` words are written by the NIC (remote RMA) and read here
// with acquire loads.
// Bit 63 of a credit word: the receiver dropped the tile of that use (not applied).
inline constexpr uint64_t kCreditNotApplied = uint64_t{1} << 63;

class SlotCredits {
 public:
  // `credit_words` points at `slots` uint64 words in registered memory (zeroed).
  SlotCredits(uint32_t slots, volatile uint64_t* credit_words);
  uint32_t slots() const { return slots_; }
  // A free slot (marked used: its epoch is bumped), or -1 when all are in flight. `also_free`
  // (optional) must also accept the slot.
  int Acquire(const std::function<bool(uint32_t)>& also_free = nullptr);
  // Whether slot `s` has been returned by the peer for its latest use.
  bool Returned(uint32_t s) const;
  uint64_t used(uint32_t s) const { return used_[s]; }
  // The peer's consume count for slot `s` (the credit word without kCreditNotApplied).
  uint64_t credit(uint32_t s) const;
  // Whether the peer's latest credit for slot `s` says the tile was dropped there, not applied.
  // Read from the credit word (which only that peer can write: its registration's key), not from
  // the immediate data, which any peer can forge.
  bool NotApplied(uint32_t s) const;
  // Local return (the use never reached the wire): counts as a credit for that use.
  void ReturnLocally(uint32_t s);
  // The peer restarted: its consume counters start again from 0, so ours re-base to match.
  void Rebase();

 private:
  const uint32_t slots_;
  volatile uint64_t* credit_;
  std::unique_ptr<uint64_t[]> used_;
  std::unique_ptr<uint64_t[]> local_returns_;
};

}  // namespace kvrail::fabric
