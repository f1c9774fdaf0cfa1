#include "wire/shm_ring.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "wire/shm_bytes.h"

namespace kvrail::wire {
namespace {

constexpr size_t kTailOffset = 64;
constexpr size_t kHeadOffset = 128;
constexpr size_t kNeedWakeOffset = 136;
constexpr size_t kOverflowOffset = 192;

// The shared words are accessed as atomics in place (lock-free, address-free for these sizes:
// the same words are mapped at different addresses in the two processes).
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));

std::atomic<uint64_t>* Word64(uint8_t* base, size_t offset) {
  return reinterpret_cast<std::atomic<uint64_t>*>(base + offset);
}
std::atomic<uint32_t>* Word32(uint8_t* base, size_t offset) {
  return reinterpret_cast<std::atomic<uint32_t>*>(base + offset);
}

using internal::Load;
using internal::Store;

bool ValidCapacity(uint32_t capacity) {
  return capacity >= kMinRingCapacity && capacity <= kMaxRingCapacity &&
         (capacity & (capacity - 1)) == 0;
}

}  // namespace

// --- Completion entries ------------------------------------------------------------------------
// Entry layout: kind u16 @0, entry_bytes u16 @2, flags u32 @4, tag u64 @8, transfer_id u64 @16,
// state i32 @24, error_code i32 @28, bytes_total u64 @32, bytes_done u64 @40,
// finished_unix_us i64 @48, reserved @56.

void EncodeCompletion(const Completion& c, uint8_t out[kCompletionEntryBytes]) {
  std::memset(out, 0, kCompletionEntryBytes);
  Store<uint16_t>(out, kCompletionKind);
  Store<uint16_t>(out + 2, static_cast<uint16_t>(kCompletionEntryBytes));
  Store<uint32_t>(out + 4, c.flags);
  Store<uint64_t>(out + 8, c.tag);
  Store<uint64_t>(out + 16, c.transfer_id);
  Store<int32_t>(out + 24, c.state);
  Store<int32_t>(out + 28, c.error_code);
  Store<uint64_t>(out + 32, c.bytes_total);
  Store<uint64_t>(out + 40, c.bytes_done);
  Store<int64_t>(out + 48, c.finished_unix_us);
}

absl::StatusOr<Completion> ParseCompletion(const uint8_t* bytes, size_t size) {
  if (size < kCompletionEntryBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion: ", size, " bytes, an entry has ", kCompletionEntryBytes));
  }
  // One copy out of shared memory: what is checked is what is used.
  uint8_t copy[kCompletionEntryBytes];
  std::memcpy(copy, bytes, sizeof(copy));
  const uint16_t kind = Load<uint16_t>(copy);
  const uint16_t entry_bytes = Load<uint16_t>(copy + 2);
  if (kind != kCompletionKind) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion.kind: ", kind, ", expected ", kCompletionKind));
  }
  if (entry_bytes != kCompletionEntryBytes) {
    return absl::InvalidArgumentError(absl::StrCat("completion.entry_bytes: ", entry_bytes,
                                                   ", expected ", kCompletionEntryBytes));
  }
  Completion c;
  c.flags = Load<uint32_t>(copy + 4);
  c.tag = Load<uint64_t>(copy + 8);
  c.transfer_id = Load<uint64_t>(copy + 16);
  c.state = Load<int32_t>(copy + 24);
  c.error_code = Load<int32_t>(copy + 28);
  c.bytes_total = Load<uint64_t>(copy + 32);
  c.bytes_done = Load<uint64_t>(copy + 40);
  c.finished_unix_us = Load<int64_t>(copy + 48);
  if (c.transfer_id == 0) return absl::InvalidArgumentError("completion.transfer_id: 0");
  // TransferState: SUCCEEDED 3, FAILED 4, CANCELLED 5 (proto/kvrail/v1/transfer.proto).
  if (c.state < 3 || c.state > 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion.state: ", c.state, " is not a final TransferState"));
  }
  if (c.error_code < 0 || c.error_code > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion.error_code: ", c.error_code, " is not a gRPC code"));
  }
  return c;
}

// --- RingView ------------------------------------------------------------------------------------

size_t RingBytes(uint32_t capacity, uint32_t slot_bytes) {
  return kRingHeaderBytes + static_cast<size_t>(capacity) * slot_bytes;
}

absl::StatusOr<RingView> RingView::Format(void* base, size_t bytes, uint32_t capacity,
                                          uint32_t slot_bytes) {
  if (!ValidCapacity(capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("capacity: ", capacity,
                                                   " is not a power of 2 in [", kMinRingCapacity,
                                                   ", ", kMaxRingCapacity, "]"));
  }
  if (slot_bytes == 0 || slot_bytes % 8 != 0 || slot_bytes > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("slot_bytes: ", slot_bytes));
  }
  if (bytes < RingBytes(capacity, slot_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: ", bytes, " < ", RingBytes(capacity, slot_bytes)));
  }
  auto* b = static_cast<uint8_t*>(base);
  std::memset(b, 0, kRingHeaderBytes);
  Store<uint32_t>(b, kRingMagic);
  Store<uint32_t>(b + 4, kRingVersion);
  Store<uint32_t>(b + 8, slot_bytes);
  Store<uint32_t>(b + 12, capacity);
  return RingView(b, capacity, slot_bytes);
}

absl::StatusOr<RingView> RingView::Open(void* base, size_t bytes, uint32_t slot_bytes) {
  auto* b = static_cast<uint8_t*>(base);
  if (bytes < kRingHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring: ", bytes, " bytes, less than its header"));
  }
  uint8_t header[16];
  std::memcpy(header, b, sizeof(header));
  if (Load<uint32_t>(header) != kRingMagic)
    return absl::InvalidArgumentError("ring.magic: not KVRQ");
  if (Load<uint32_t>(header + 4) != kRingVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring.version: ", Load<uint32_t>(header + 4), ", expected ", kRingVersion));
  }
  if (Load<uint32_t>(header + 8) != slot_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring.slot_bytes: ", Load<uint32_t>(header + 8), ", expected ", slot_bytes));
  }
  const uint32_t capacity = Load<uint32_t>(header + 12);
  if (!ValidCapacity(capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("ring.capacity: ", capacity,
                                                   " is not a power of 2 in [", kMinRingCapacity,
                                                   ", ", kMaxRingCapacity, "]"));
  }
  if (bytes != RingBytes(capacity, slot_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("ring.capacity: ", capacity, " needs ",
                                                   RingBytes(capacity, slot_bytes),
                                                   " bytes, the memory has ", bytes));
  }
  RingView view(b, capacity, slot_bytes);
  // Both sides start at what the memory says; from here on each keeps its own index.
  view.tail_ = Word64(b, kTailOffset)->load(std::memory_order_acquire);
  view.head_ = Word64(b, kHeadOffset)->load(std::memory_order_acquire);
  if (view.tail_ - view.head_ > capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring.tail: ", view.tail_, " and ring.head: ", view.head_, " are impossible"));
  }
  return view;
}

absl::StatusOr<uint64_t> RingView::FreeSlots() const {
  const uint64_t head = Word64(base_, kHeadOffset)->load(std::memory_order_acquire);
  const uint64_t used = tail_ - head;  // wraps to a huge value when head is ahead of tail
  if (used > capacity_) {
    return absl::DataLossError(absl::StrCat("ring.head: ", head, " is impossible (tail ", tail_,
                                            ", capacity ", capacity_, ")"));
  }
  return capacity_ - used;
}

void RingView::Publish(uint64_t slots) {
  tail_ += slots;
  Word64(base_, kTailOffset)->store(tail_, std::memory_order_release);
}

absl::Status RingView::TryPush(const uint8_t* entry, size_t size) {
  if (size > slot_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry: ", size, " bytes, a slot has ", slot_bytes_));
  }
  const absl::StatusOr<uint64_t> free = FreeSlots();
  if (!free.ok()) return free.status();
  if (*free == 0) return absl::ResourceExhaustedError("ring: full");
  uint8_t* slot = Slot(tail_);
  std::memcpy(slot, entry, size);
  if (size < slot_bytes_) std::memset(slot + size, 0, slot_bytes_ - size);
  Publish(1);
  return absl::OkStatus();
}

absl::Status RingView::TryPushSlots(const uint8_t* bytes, size_t slots) {
  const absl::StatusOr<uint64_t> free = FreeSlots();
  if (!free.ok()) return free.status();
  if (slots > *free) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ring: ", *free, " slots free, ", slots, " needed"));
  }
  for (size_t i = 0; i < slots; ++i) {
    std::memcpy(Slot(tail_ + i), bytes + i * slot_bytes_, slot_bytes_);
  }
  Publish(slots);
  return absl::OkStatus();
}

void RingView::AddOverflow() {
  Word64(base_, kOverflowOffset)->fetch_add(1, std::memory_order_acq_rel);
}

bool RingView::ConsumerSleeps() const {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return Word32(base_, kNeedWakeOffset)->load(std::memory_order_relaxed) != 0;
}

absl::StatusOr<uint64_t> RingView::LoadTail() const {
  const uint64_t tail = Word64(base_, kTailOffset)->load(std::memory_order_acquire);
  if (tail - head_ > capacity_) {
    return absl::DataLossError(absl::StrCat("ring.tail: ", tail, " is impossible (head ", head_,
                                            ", capacity ", capacity_, ")"));
  }
  return tail;
}

bool RingView::Ready() const {
  return Word64(base_, kTailOffset)->load(std::memory_order_acquire) != head_;
}

absl::StatusOr<uint64_t> RingView::Published() const {
  absl::StatusOr<uint64_t> tail = LoadTail();
  if (!tail.ok()) return tail.status();
  return *tail - head_;
}

void RingView::StoreHead(uint64_t head) {
  Word64(base_, kHeadOffset)->store(head, std::memory_order_release);
}

void RingView::SetNeedWake(bool sleeping) {
  Word32(base_, kNeedWakeOffset)->store(sleeping ? 1 : 0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

uint64_t RingView::overflow() const {
  return Word64(base_, kOverflowOffset)->load(std::memory_order_acquire);
}

// --- SharedRing ----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<SharedRing>> SharedRing::Create(uint32_t capacity,
                                                               uint32_t slot_bytes,
                                                               const char* name) {
  if (!ValidCapacity(capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("capacity: ", capacity,
                                                   " is not a power of 2 in [", kMinRingCapacity,
                                                   ", ", kMaxRingCapacity, "]"));
  }
  const size_t bytes = RingBytes(capacity, slot_bytes);
  UniqueFd memfd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!memfd.valid())
    return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  if (::ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("ftruncate: ", std::strerror(errno)));
  }
  if (::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::InternalError(absl::StrCat("F_ADD_SEALS: ", std::strerror(errno)));
  }
  UniqueFd event(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event.valid()) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (map == MAP_FAILED)
    return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
  absl::StatusOr<RingView> view = RingView::Format(map, bytes, capacity, slot_bytes);
  if (!view.ok()) {
    ::munmap(map, bytes);
    return view.status();
  }
  return std::unique_ptr<SharedRing>(
      new SharedRing(std::move(memfd), std::move(event), map, bytes, *view));
}

absl::StatusOr<std::unique_ptr<SharedRing>> SharedRing::Attach(UniqueFd memfd, UniqueFd eventfd,
                                                               uint32_t slot_bytes) {
  const int seals = ::fcntl(memfd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    if (::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
      return absl::InvalidArgumentError(
          "ring memfd: not sealed against shrinking and cannot be (create it with "
          "MFD_ALLOW_SEALING)");
    }
  }
  struct stat st {};
  if (::fstat(memfd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError("ring memfd: not a regular file");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < kRingHeaderBytes || bytes > RingBytes(kMaxRingCapacity, 4096)) {
    return absl::InvalidArgumentError(absl::StrCat("ring memfd: ", bytes, " bytes"));
  }
  // An eventfd answers a read of fewer than 8 bytes with EINVAL; anything else (a pipe, a
  // socket, a file) is refused by its /proc link name instead of a probe that could block.
  char link[64];
  char target[64] = {0};
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", eventfd.get());
  const ssize_t n = ::readlink(link, target, sizeof(target) - 1);
  if (n <= 0 || std::strcmp(target, "anon_inode:[eventfd]") != 0) {
    return absl::InvalidArgumentError("ring eventfd: not an eventfd");
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (map == MAP_FAILED)
    return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
  absl::StatusOr<RingView> view = RingView::Open(map, bytes, slot_bytes);
  if (!view.ok()) {
    ::munmap(map, bytes);
    return view.status();
  }
  return std::unique_ptr<SharedRing>(
      new SharedRing(std::move(memfd), std::move(eventfd), map, bytes, *view));
}

SharedRing::~SharedRing() { ::munmap(map_, bytes_); }

void SharedRing::Wake() const {
  const uint64_t one = 1;
  // EAGAIN: the count is at its maximum, so the consumer is awake anyway.
  (void)!::write(eventfd_.get(), &one, sizeof(one));
}

void SharedRing::DrainWakes() const {
  uint64_t count;
  (void)!::read(eventfd_.get(), &count, sizeof(count));
}

}  // namespace kvrail::wire
