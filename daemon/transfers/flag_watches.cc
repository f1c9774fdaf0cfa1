#include "daemon/transfers/flag_watches.h"

#include <utility>
#include <vector>

namespace kvrail::transfers {

FlagWatches::FlagWatches(absl::Duration poll_interval)
    : watcher_(readiness::FlagWatcher::Create(poll_interval)) {}

void FlagWatches::Add(const std::shared_ptr<Record>& record,
                      std::shared_ptr<regions::Region> region, uint32_t* words, uint32_t value,
                      uint32_t first) {
  std::weak_ptr<Record> weak = record;
  // Created outside mu_: Watch takes the watcher's lock, under which the poller runs callbacks.
  Watched watched(watcher_->Watch(words, record->plan().num_layers(), value,
                                  [weak, first](uint32_t i) {
                                    auto r = weak.lock();
                                    if (r == nullptr) return;
                                    auto tiles = r->MarkReady(first + i, 1);
                                    if (tiles.ok()) r->engine()->Enqueue(r, *tiles);
                                  }),
                  std::move(region), weak);
  Watched replaced;
  {
    absl::MutexLock lock(&mu_);
    replaced = std::exchange(watches_[record->id()], std::move(watched));
  }
  // `replaced` (normally empty) and `watched` (moved from) go here, outside mu_.
}

void FlagWatches::Sweep() {
  std::vector<Watched> done;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = watches_.begin(); it != watches_.end();) {
      auto r = it->second.record.lock();
      if (r == nullptr || r->IsFinal()) {
        done.push_back(std::move(it->second));
        watches_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  // `done` is destroyed here, outside mu_ (a handle's destructor takes the watcher's lock).
}

size_t FlagWatches::size() const {
  absl::MutexLock lock(&mu_);
  return watches_.size();
}

}  // namespace kvrail::transfers
