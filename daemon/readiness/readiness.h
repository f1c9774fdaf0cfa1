// Cross-process readiness without a round trip through the daemon's RPCs.
//
// Producer side: a prefill process marks "layer L written" by writing a 32-bit flag word in shared
// memory, from its CPU or from its own CUDA stream (cuStreamWriteValue32 on host memory it has
// registered with the GPU). A FlagWatcher in the daemon sees the word reach the transfer's value
// and releases that layer's tiles.
// Consumer side: the daemon writes flag word L when every tile of layer L has landed
// (SignalFlag); a decode process waits for it on its stream (cuStreamWaitValue32, GEQ) or CPU.
//
// Flags are epoch counters, never reset: a word is ready when it has reached `value` in wrapping
// 32-bit order, so one flag array serves transfer after transfer with increasing values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/time/time.h"

namespace kvrail::readiness {

// True when `word` has reached `value` in wrapping 32-bit order (within 2^31 of it).
inline bool Reached(uint32_t word, uint32_t value) {
  return static_cast<int32_t>(word - value) >= 0;
}

// Stores `value` into words[index] with release ordering: everything written before (the layer's
// bytes) is visible to whoever observes the flag.
void SignalFlag(uint32_t* words, uint32_t index, uint32_t value);

// One registration; destroying it stops the watch and waits until its callback is not running.
// Callbacks must not create or destroy watches (they run under the watcher's lock).
class WatchHandle {
 public:
  virtual ~WatchHandle() = default;
};

// One poller thread for all watches. Thread-safe.
class FlagWatcher {
 public:
  virtual ~FlagWatcher() = default;
  // `poll_interval` is the sleep between sweeps when nothing became ready (the latency floor).
  static std::unique_ptr<FlagWatcher> Create(absl::Duration poll_interval);
  // Watches words[0, count); `on_ready(i)` runs once per index, on the poller thread, the first
  // time words[i] reaches `value`. The words must stay mapped while the handle lives.
  virtual std::unique_ptr<WatchHandle> Watch(const volatile uint32_t* words, uint32_t count,
                                             uint32_t value,
                                             std::function<void(uint32_t)> on_ready) = 0;
  virtual size_t active_watches() const = 0;
};

}  // namespace kvrail::readiness
