#include "daemon/fabric/command_ring.h"

#include <sys/mman.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvrail::fabric {

absl::StatusOr<std::unique_ptr<CommandRing>> CommandRing::Create(uint32_t capacity) {
  if (capacity == 0 || (capacity & (capacity - 1)) != 0 || capacity > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring capacity ", capacity, " must be a power of two in [1, 2^20]"));
  }
  const size_t bytes = sizeof(RingHeader) + size_t{capacity} * sizeof(kernels::NicCommand);
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("mmap of a ", bytes, "-byte ring failed"));
  }
  // On a GPU machine the packing kernel's first use registers it with CUDA (DeviceMemory).
  return std::unique_ptr<CommandRing>(new CommandRing(memory, bytes, capacity));
}

CommandRing::CommandRing(void* memory, size_t bytes, uint32_t capacity)
    : memory_(memory), bytes_(bytes), capacity_(capacity) {
  header_ = new (memory) RingHeader();
  header_->reserved.store(0);
  header_->consumed.store(0);
  slots_ =
      reinterpret_cast<kernels::NicCommand*>(static_cast<uint8_t*>(memory) + sizeof(RingHeader));
}

CommandRing::~CommandRing() {
  {
    absl::MutexLock lock(&map_mu_);
    mapping_.reset();  // unregistered before it is unmapped
  }
  munmap(memory_, bytes_);
}

uint8_t* CommandRing::DeviceMemory(const MapFn& map) {
  absl::MutexLock lock(&map_mu_);
  if (!map_tried_) {
    map_tried_ = true;
    auto [device, handle] = map(memory(), bytes_);
    device_memory_ = device;
    mapping_ = std::move(handle);
  }
  return device_memory_;
}

bool CommandRing::TryPush(const kernels::NicCommand& cmd) {
  const std::optional<uint64_t> seq = Reserve();
  if (!seq.has_value()) return false;
  Publish(*seq, cmd);
  return true;
}

std::optional<uint64_t> CommandRing::Reserve() {
  uint64_t seq = header_->reserved.load(std::memory_order_relaxed);
  do {
    if (seq - header_->consumed.load(std::memory_order_acquire) >= capacity_) return std::nullopt;
  } while (!header_->reserved.compare_exchange_weak(seq, seq + 1, std::memory_order_acq_rel));
  return seq;
}

void CommandRing::Publish(uint64_t seq, const kernels::NicCommand& cmd) {
  kernels::NicCommand* slot = SlotAt(seq);
  // Body first, epoch last: the consumer trusts the body once it sees this lap's epoch.
  kernels::NicCommand body = cmd;
  body.epoch = 0;
  std::memcpy(static_cast<void*>(slot), &body, offsetof(kernels::NicCommand, epoch));
  reinterpret_cast<std::atomic<uint32_t>*>(&slot->epoch)
      ->store(EpochOf(seq, capacity_), std::memory_order_release);
}

void CommandRing::PublishNone(uint64_t seq) {
  kernels::NicCommand none{};
  none.opcode = kOpNone;
  Publish(seq, none);
}

std::optional<kernels::NicCommand> CommandRing::Pop() {
  while (true) {
    const uint64_t seq = header_->consumed.load(std::memory_order_relaxed);
    kernels::NicCommand* slot = SlotAt(seq);
    const uint32_t epoch =
        reinterpret_cast<std::atomic<uint32_t>*>(&slot->epoch)->load(std::memory_order_acquire);
    if (epoch != EpochOf(seq, capacity_)) return std::nullopt;
    kernels::NicCommand cmd;
    std::memcpy(&cmd, static_cast<const void*>(slot), sizeof(cmd));
    header_->consumed.store(seq + 1, std::memory_order_release);
    if (cmd.opcode != kOpNone) return cmd;
  }
}

uint64_t CommandRing::Pending() const {
  return header_->reserved.load(std::memory_order_acquire) -
         header_->consumed.load(std::memory_order_acquire);
}

SlotCredits::SlotCredits(uint32_t slots, volatile uint64_t* credit_words)
    : slots_(slots),
      credit_(credit_words),
      used_(new uint64_t[slots]()),
      local_returns_(new uint64_t[slots]()) {}

int SlotCredits::Acquire(const std::function<bool(uint32_t)>& also_free) {
  for (uint32_t s = 0; s < slots_; ++s) {
    if (Returned(s) && (!also_free || also_free(s))) {
      ++used_[s];
      return static_cast<int>(s);
    }
  }
  return -1;
}

uint64_t SlotCredits::credit(uint32_t s) const {
  return reinterpret_cast<const std::atomic<uint64_t>*>(const_cast<const uint64_t*>(&credit_[s]))
             ->load(std::memory_order_acquire) &
         ~kCreditNotApplied;
}

bool SlotCredits::NotApplied(uint32_t s) const {
  return (reinterpret_cast<const std::atomic<uint64_t>*>(const_cast<const uint64_t*>(&credit_[s]))
              ->load(std::memory_order_acquire) &
          kCreditNotApplied) != 0;
}

bool SlotCredits::Returned(uint32_t s) const { return credit(s) + local_returns_[s] >= used_[s]; }

void SlotCredits::ReturnLocally(uint32_t s) { ++local_returns_[s]; }

void SlotCredits::Rebase() {
  for (uint32_t s = 0; s < slots_; ++s) {
    used_[s] = 0;
    local_returns_[s] = 0;
    reinterpret_cast<std::atomic<uint64_t>*>(const_cast<uint64_t*>(&credit_[s]))
        ->store(0, std::memory_order_release);
  }
}

}  // namespace kvrail::fabric
