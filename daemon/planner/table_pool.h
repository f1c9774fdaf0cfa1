// Pooled memory for plans' block tables: a TableAllocator (planner.h) that keeps freed buffers for
// the next plan, over heap memory or pinned host memory (the CUDA engine's). Kept out of the pure
// planner, which takes it as an injected allocator (PlanOptions::tables).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "daemon/planner/planner.h"

namespace kvrail::planner {

// Recycles table buffers by power-of-two size class. Thread contract: thread-safe (one mutex
// around the free lists and counters). Buffers out of the pool keep it alive (they hold a
// shared_ptr to it), so a pool may be dropped by its creator while plans still use its buffers.
class TablePool final : public TableAllocator, public std::enable_shared_from_this<TablePool> {
 public:
  // How the pool gets and returns memory (plain heap, or cudaHostAlloc / cudaFreeHost).
  // `allocate` returns nullptr on failure; a pinned pool then falls back to heap memory for that
  // buffer (pinned memory may be capped, e.g. by RLIMIT_MEMLOCK in a container: plans must not
  // fail for it), which goes back to the heap, not into the pool.
  struct Allocator {
    std::function<void*(size_t bytes)> allocate;
    std::function<void(void* memory)> release;
    bool pinned = false;  // memory a GPU copy engine can read without staging
  };
  // `retain_bytes`: free memory kept for reuse at most (beyond it freed buffers go back).
  static std::shared_ptr<TablePool> Create(Allocator allocator, uint64_t retain_bytes);
  // The heap allocator (page-aligned), not pinned.
  static Allocator Heap();
  ~TablePool() override;

  // A buffer of at least `bytes`, rounded up to its class; memory == nullptr when allocation
  // failed. `pinned`: whether this buffer is the allocator's pinned memory.
  Memory Take(size_t bytes) override;

  bool pinned() const { return allocator_.pinned; }
  // Bytes now held free, buffers ever allocated from `allocate`, and heap buffers handed out
  // because a pinned `allocate` failed (for tests and stats).
  uint64_t free_bytes() const;
  uint64_t allocations() const;
  uint64_t fallbacks() const;

 private:
  struct Free {
    std::shared_ptr<TablePool> pool;
    size_t bytes;
    bool heap_fallback;
    void operator()(void* memory) const { pool->Give(memory, bytes, heap_fallback); }
  };
  TablePool(Allocator allocator, uint64_t retain_bytes)
      : allocator_(std::move(allocator)), retain_bytes_(retain_bytes) {}
  void Give(void* memory, size_t bytes, bool heap_fallback);

  const Allocator allocator_;
  const uint64_t retain_bytes_;
  mutable absl::Mutex mu_;
  std::multimap<size_t, void*> free_ ABSL_GUARDED_BY(mu_);
  uint64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fallbacks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvrail::planner
