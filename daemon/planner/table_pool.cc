#include "daemon/planner/table_pool.h"

#include <cstdlib>
#include <cstring>

namespace kvrail::planner {
namespace {

// Smallest class: one page; classes are powers of two so a freed buffer fits the next plan of
// about the same size.
constexpr size_t kMinClassBytes = 4096;

size_t ClassBytes(size_t bytes) {
  size_t c = kMinClassBytes;
  while (c < bytes) c *= 2;
  return c;
}

}  // namespace

std::shared_ptr<TablePool> TablePool::Create(Allocator allocator, uint64_t retain_bytes) {
  return std::shared_ptr<TablePool>(new TablePool(std::move(allocator), retain_bytes));
}

TablePool::Allocator TablePool::Heap() {
  Allocator a;
  a.allocate = [](size_t bytes) { return std::aligned_alloc(kMinClassBytes, bytes); };
  a.release = [](void* memory) { std::free(memory); };
  return a;
}

TablePool::~TablePool() {
  // Every buffer out of the pool holds the pool, so only free ones are left.
  for (auto& [bytes, memory] : free_) allocator_.release(memory);
}

uint64_t TablePool::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return free_bytes_;
}

uint64_t TablePool::allocations() const {
  absl::MutexLock lock(&mu_);
  return allocations_;
}

uint64_t TablePool::fallbacks() const {
  absl::MutexLock lock(&mu_);
  return fallbacks_;
}

TableAllocator::Memory TablePool::Take(size_t bytes) {
  const size_t size = ClassBytes(bytes);
  void* memory = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(size);
    if (it != free_.end()) {
      memory = it->second;
      free_.erase(it);
      free_bytes_ -= size;
    } else {
      ++allocations_;
    }
  }
  if (memory == nullptr) memory = allocator_.allocate(size);
  bool heap_fallback = false;
  if (memory == nullptr && allocator_.pinned) {
    memory = std::aligned_alloc(kMinClassBytes, size);
    heap_fallback = memory != nullptr;
    if (heap_fallback) {
      absl::MutexLock lock(&mu_);
      ++fallbacks_;
    }
  }
  if (memory == nullptr) return Memory{};
  return Memory{std::shared_ptr<void>(memory, Free{shared_from_this(), size, heap_fallback}),
                allocator_.pinned && !heap_fallback};
}

void TablePool::Give(void* memory, size_t bytes, bool heap_fallback) {
  if (heap_fallback) {
    std::free(memory);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (free_bytes_ + bytes <= retain_bytes_) {
      free_.emplace(bytes, memory);
      free_bytes_ += bytes;
      return;
    }
  }
  allocator_.release(memory);
}

}  // namespace kvrail::planner
