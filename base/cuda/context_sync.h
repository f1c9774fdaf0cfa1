// Context-synchronizing CUDA calls in flight, process-wide. A call such as
// cudaHostRegister/Unregister, cudaIpcOpenMemHandle/CloseMemHandle, cuMemMap/Unmap, cudaFreeHost,
// cudaHostAlloc, cudaDeviceEnablePeerAccess or a lazy module load waits for every stream of the
// context to drain - including a stream of the CUDA engine that waits on the GPU for a
// producer's ready flag (cuStreamWaitValue32). The daemon wraps such calls in a
// ContextSyncScope; the CUDA engine's gate watchdog reads OldestContextSync and releases its own
// pending waits when one has been blocked longer than its bound (scheduler::DecideGateRelease),
// so a producer that waits for kvraild (e.g. for a region registration stuck behind the wait)
// cannot deadlock it.
//
// No CUDA here. Thread-safe; the clock is absl::Now unless a test injects one.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/time/time.h"

namespace kvrail::cuda {

// Marks the current thread as inside a context-synchronizing call named `what` (a string
// literal: kept by pointer) from construction to destruction.
class ContextSyncScope {
 public:
  explicit ContextSyncScope(const char* what);
  ~ContextSyncScope();
  ContextSyncScope(const ContextSyncScope&) = delete;
  ContextSyncScope& operator=(const ContextSyncScope&) = delete;

 private:
  uint64_t id_;
};

struct OpenContextSync {
  absl::Time since;       // when the oldest open scope began
  const char* what = "";  // its name
  int open = 0;           // scopes open now
};
// The oldest scope open now; nullopt when none is.
std::optional<OpenContextSync> OldestContextSync();

// Tests: the clock scopes are stamped with (nullptr: absl::Now).
void SetContextSyncClockForTest(absl::Time (*now)());

}  // namespace kvrail::cuda
