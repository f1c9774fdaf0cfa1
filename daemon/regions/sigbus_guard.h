// Internal to regions/: turns a SIGBUS inside a registered host mapping into a poisoned region
// instead of a dead daemon (docs/security.md, "Memory").
//
// A client can make pages of memory kvraild has mapped from its fd vanish: truncating a POSIX
// shm object (which cannot be sealed), or filling the tmpfs under a sparse one. An access then
// raises SIGBUS in whichever daemon thread touches it. The guard's process-wide handler
// (sigaction, SA_SIGINFO) looks the fault address up in a fixed table of guarded ranges
// (lock-free, async-signal-safe), maps anonymous zero pages over the whole range (MAP_FIXED: one
// mmap, so a truncated gigabyte costs one signal, not one per page), marks the range poisoned
// and returns: the interrupted copy completes harmlessly on the zero pages, and the owner of the
// range (the region) reports the poison so the transfer that touched it fails. Faults outside
// every guarded range go to the handler installed before (the default action: the process dies
// with SIGBUS, as without the guard).
//
// Thread contract: every function is thread-safe. Add/Remove serialize on a mutex; the handler
// and Poisoned() only read atomics.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace kvrail::regions {

class SigbusGuard {
 public:
  // Most ranges guarded at once (every host mapping of the daemon is one).
  static constexpr size_t kCapacity = size_t{1} << 20;

  // Guards [base, base + length) (page-aligned) and returns its slot. Installs the handler on
  // the first call. RESOURCE_EXHAUSTED when kCapacity ranges are guarded; INTERNAL when
  // sigaction fails.
  static absl::StatusOr<uint32_t> Add(void* base, size_t length);
  // Stops guarding the slot's range. Call before unmapping it, when nothing can touch it.
  static void Remove(uint32_t slot);
  // Whether a fault hit the slot's range since Add.
  static bool Poisoned(uint32_t slot);
  // Faults turned into poison since the process started (for tests and logs).
  static uint64_t FaultsCaught();
};

}  // namespace kvrail::regions
