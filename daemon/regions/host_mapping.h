// Internal to regions/: host memory mapped from a client's fd (memfd or shm object).
#pragma once

#include <sys/mman.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace kvrail::regions {

// Owns one mmap. Not thread-safe to move; the mapping itself is shared read/write memory.
class Mapping {
 public:
  Mapping(void* base, size_t length) : base_(base), length_(length) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base_ != nullptr) ::munmap(base_, length_);
  }
  uint8_t* at(size_t offset) const { return static_cast<uint8_t*>(base_) + offset; }
  void* base() const { return base_; }
  size_t length() const { return length_; }

 private:
  void* base_;
  size_t length_;
};

std::string ErrnoText(int err);

// Maps [offset, offset + size) of `fd` (file size checked first), read-only unless writable.
// Errors name `field` (and spec.size_bytes / spec.writable where those are the cause).
absl::StatusOr<std::pair<std::unique_ptr<Mapping>, uint8_t*>> MapFd(int fd, uint64_t offset,
                                                                    uint64_t size, bool writable,
                                                                    const char* field);

}  // namespace kvrail::regions
