// Internal to the transfers module: producer readiness (spec.ready_flags). A layer-wise
// transfer's layers are released as its flag words reach the transfer's value.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/readiness/readiness.h"
#include "daemon/regions/regions.h"
#include "daemon/transfers/record.h"

namespace kvrail::transfers {

// One transfer's watch: the poller reads `words` of `region` until `handle` is gone, so the
// handle must be destroyed (stopping the watch and waiting out a running callback) before the
// region's mapping may go. The destructor does exactly that, whatever order the fields are
// declared or assigned in. Thread-compatible; move-only.
struct Watched {
  Watched() = default;
  Watched(std::unique_ptr<readiness::WatchHandle> h, std::shared_ptr<regions::Region> r,
          std::weak_ptr<Record> rec)
      : handle(std::move(h)), region(std::move(r)), record(std::move(rec)) {}
  Watched(Watched&&) = default;
  Watched& operator=(Watched&& other) {
    Release();
    handle = std::move(other.handle);
    region = std::move(other.region);
    record = std::move(other.record);
    return *this;
  }
  ~Watched() { Release(); }
  // The watch first, then the mapping it reads.
  void Release() {
    handle.reset();
    region.reset();
  }

  std::unique_ptr<readiness::WatchHandle> handle;
  std::shared_ptr<regions::Region> region;  // keeps the flag words mapped
  std::weak_ptr<Record> record;
};

// The ready-flag watches of one manager. Thread-safe. Lock order: callers hold none of the
// manager's locks; a watch is created and destroyed outside mu_ (the poller runs callbacks under
// its own lock, and a callback takes the record's lock and the engine's).
class FlagWatches {
 public:
  explicit FlagWatches(absl::Duration poll_interval);
  // Releases layer `first + i` of `record` when word i reaches `value`. The callback holds only a
  // weak reference; Sweep drops the watch once the transfer has ended.
  void Add(const std::shared_ptr<Record>& record, std::shared_ptr<regions::Region> region,
           uint32_t* words, uint32_t value, uint32_t first);
  // Drops the watches of ended transfers.
  void Sweep();
  size_t size() const;

 private:
  const std::unique_ptr<readiness::FlagWatcher> watcher_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Watched> watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail::transfers
