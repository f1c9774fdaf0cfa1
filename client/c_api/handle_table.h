// Internal to //client/c_api: the table behind the C ABI's opaque handles. A handle is a number
// issued once per process (never reused, never an address), so a stale, doubly freed or foreign
// handle is found missing instead of being dereferenced.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace kvrail::c_api {

// The next handle number. One counter for every table: a handle of one kind is never a live
// handle of another kind.
inline uint64_t NextHandle() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// Objects of type T by handle number, shared-owned: Find hands a caller its own reference, so an
// object removed while calls are still using it lives until the last of them returns.
// Thread contract: every method may be called concurrently from any thread (mu_ guards the map).
template <typename T>
class HandleTable {
 public:
  // Stores `object` and returns its new handle (never 0).
  uint64_t Add(std::shared_ptr<T> object) {
    const uint64_t handle = NextHandle();
    absl::MutexLock lock(&mu_);
    objects_.emplace(handle, std::move(object));
    return handle;
  }

  // The live object of `handle`, or null (0, removed, never issued, or another table's).
  std::shared_ptr<T> Find(uint64_t handle) const {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(handle);
    return it == objects_.end() ? nullptr : it->second;
  }

  // Retires `handle` for good; returns the table's reference (null when it was not live), which
  // the caller drops outside the lock.
  std::shared_ptr<T> Remove(uint64_t handle) {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(handle);
    if (it == objects_.end()) return nullptr;
    std::shared_ptr<T> object = std::move(it->second);
    objects_.erase(it);
    return object;
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return objects_.size();
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<T>> objects_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail::c_api
