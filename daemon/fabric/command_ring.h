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
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/device_abi.h"
#include "kernels/fabric_math.h"

namespace kvrail::fabric {

// NicCommand.opcode values. kOpNone fills a reserved sequence number whose producer gave up (a
// failed kernel launch): the consumer skips it.
inline constexpr uint32_t kOpNone = 0;
inline constexpr uint32_t kOpWriteTile = 1;
static_assert(kOpWriteTile == kernels::kFabricOpWriteTile, "the packing kernel's opcode");

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
  // credit): the producer retries later. Never blocks. (= Reserve + Publish.)
  bool TryPush(const kernels::NicCommand& cmd);
  // For a producer that is no host thread (the packing kernel, kernels/fabric_pack.h): reserves
  // the next sequence number without writing anything (nullopt when the ring is full). The
  // producer then writes SlotAt(seq)'s body and, last, its epoch EpochOf(seq) with a release
  // store (the kernel: st.release.sys). Every reserved number must be published, by the producer
  // or with Publish/PublishNone, or the consumer stops at it.
  std::optional<uint64_t> Reserve();
  // Host publication of a reserved number.
  void Publish(uint64_t seq, const kernels::NicCommand& cmd);
  // Publishes kOpNone at a reserved number (its producer gave up): the consumer skips it.
  void PublishNone(uint64_t seq);
  // The ring slot of `seq` (host address; the device address is the mapping's of the same byte).
  kernels::NicCommand* SlotAt(uint64_t seq) const { return &slots_[seq & (capacity_ - 1)]; }
  // The ring's memory (header and slots): what the daemon registers with CUDA (mapped).
  uint8_t* memory() const { return static_cast<uint8_t*>(memory_); }
  size_t bytes() const { return bytes_; }
  // The device address of memory() for the packing kernel, made on the first call by `map`
  // (which registers the ring with CUDA, mapped, and returns the device address of `host` and a
  // handle undoing that, kept until the ring is unmapped); nullptr when `map` failed (not tried
  // again). Thread-safe.
  using MapFn =
      std::function<std::pair<uint8_t*, std::shared_ptr<void>>(uint8_t* host, size_t bytes)>;
  uint8_t* DeviceMemory(const MapFn& map);
  // The next published command, or nullopt when the next slot is not published yet. kOpNone
  // commands are consumed and skipped.
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
  absl::Mutex map_mu_;
  bool map_tried_ ABSL_GUARDED_BY(map_mu_) = false;
  uint8_t* device_memory_ ABSL_GUARDED_BY(map_mu_) = nullptr;
  std::shared_ptr<void> mapping_ ABSL_GUARDED_BY(map_mu_);
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
