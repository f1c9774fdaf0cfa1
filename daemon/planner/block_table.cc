#include <cstdlib>
#include <cstring>

#include "daemon/planner/planner.h"

namespace kvrail::planner {

BlockTable BlockTable::Allocate(size_t n, TableAllocator* allocator) {
  BlockTable t;
  t.n_ = n;
  if (n == 0) return t;
  const size_t bytes = n * sizeof(uint32_t);
  if (allocator == nullptr) {
    void* memory = std::malloc(bytes);
    if (memory != nullptr) t.memory_ = std::shared_ptr<void>(memory, std::free);
    return t;
  }
  TableAllocator::Memory m = allocator->Take(bytes);
  t.memory_ = std::move(m.memory);
  t.pinned_ = t.memory_ != nullptr && m.pinned;
  return t;
}

bool operator==(const BlockTable& a, const BlockTable& b) {
  return a.size() == b.size() &&
         (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(uint32_t)) == 0);
}

}  // namespace kvrail::planner
