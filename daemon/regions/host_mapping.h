// Internal to regions/: host memory mapped from a client's fd (memfd or POSIX shm object), and
// the rules it must meet (docs/security.md, "Memory").
#pragma once

#include <sys/mman.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "daemon/regions/sigbus_guard.h"

namespace kvrail::regions {

// Owns one mmap, guarded against SIGBUS (sigbus_guard.h) for its whole life. Not thread-safe to
// move; the mapping itself is shared read/write memory, and sealed()/poisoned() are thread-safe.
class Mapping {
 public:
  Mapping(void* base, size_t length, bool sealed, uint32_t guard_slot)
      : base_(base), length_(length), sealed_(sealed), guard_slot_(guard_slot) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    SigbusGuard::Remove(guard_slot_);
    ::munmap(base_, length_);
  }
  uint8_t* at(size_t offset) const { return static_cast<uint8_t*>(base_) + offset; }
  void* base() const { return base_; }
  size_t length() const { return length_; }
  // The fd was sealed against shrinking (F_SEAL_SHRINK): its owner cannot truncate it.
  bool sealed() const { return sealed_; }
  // A fault hit the mapping (its owner truncated the object): it now reads zero pages.
  bool poisoned() const { return SigbusGuard::Poisoned(guard_slot_); }

 private:
  void* const base_;
  const size_t length_;
  const bool sealed_;
  const uint32_t guard_slot_;
};

std::string ErrnoText(int err);

// Maps [offset, offset + size) of `fd`, read-only unless writable. The fd must be a regular file
// on tmpfs (a memfd or a /dev/shm object; FAILED_PRECONDITION for hugetlbfs, disk files and
// anything else, naming `field`); it is sealed against shrinking where the kernel allows
// (memfds made with MFD_ALLOW_SEALING) and guarded either way. Pages are not populated: a
// sparse object commits only what transfers touch. Errors name `field` (and spec.size_bytes /
// spec.writable where those are the cause).
absl::StatusOr<std::pair<std::unique_ptr<Mapping>, uint8_t*>> MapFd(int fd, uint64_t offset,
                                                                    uint64_t size, bool writable,
                                                                    const char* field);

// Host regions of at most this many bytes are pre-faulted at registration (PrefaultResident):
// the client library's block-table region (1 MiB by default, RegionSpec.library_region) and the
// servers' own BlockTableRef regions are read by the daemon on every large submit, and the first
// submit otherwise takes the minor faults (17 per MiB read, the kernel mapping 64 KiB around each;
// host_memory_test). They were suspected in the first transfer's slow accept (123 us against
// 54-60 later); on one H200 the pre-fault did not shorten it (docs/benchmarks.md).
inline constexpr uint64_t kPrefaultMaxBytes = uint64_t{16} << 20;

// Maps into this process's page tables the pages of `mapping` (MapFd's: exactly the region's
// pages) that the shared object already holds (mincore), by reading one byte of each; holes stay
// holes (no page is committed). Best effort: a failing mincore touches nothing. The mapping is
// guarded, so an object truncated meanwhile poisons the region instead of killing the daemon.
void PrefaultResident(const Mapping& mapping);

}  // namespace kvrail::regions
