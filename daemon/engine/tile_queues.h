// Internal to the engine module: the queued tiles of jobs, one FIFO of jobs per priority class,
// shared by the host and CUDA engines so both schedule the same way (higher class first, round
// robin within a class, re-chosen at every take: preemption at tile or batch granularity).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "daemon/engine/engine.h"

namespace kvrail::engine {

// Not thread-safe: the owning engine guards it with its own lock.
class TileQueues {
 public:
  // Appends `tiles` to the job's entry in its class (a new entry goes to the back).
  void Add(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) {
    if (tiles.empty()) return;
    auto& queue = queues_[static_cast<int>(job->priority())];
    for (Entry& e : queue) {
      if (e.job == job) {
        e.tiles.insert(e.tiles.end(), tiles.begin(), tiles.end());
        return;
      }
    }
    queue.push_back(Entry{job, std::deque<uint32_t>(tiles.begin(), tiles.end())});
  }

  // Drops the job's queued tiles; returns how many.
  size_t Remove(const Job* job) {
    size_t removed = 0;
    for (auto& queue : queues_) {
      for (auto it = queue.begin(); it != queue.end();) {
        if (it->job.get() == job) {
          removed += it->tiles.size();
          it = queue.erase(it);
        } else {
          ++it;
        }
      }
    }
    return removed;
  }

  bool Empty(int cls) const { return queues_[cls].empty(); }
  bool AllEmpty() const {
    for (const auto& q : queues_) {
      if (!q.empty()) return false;
    }
    return true;
  }

  bool Contains(const Job* job) const {
    for (const auto& queue : queues_) {
      for (const Entry& e : queue) {
        if (e.job.get() == job) return true;
      }
    }
    return false;
  }

  // Adds the queued tile count of each class to (*counts)[class].
  void AddCounts(std::vector<uint64_t>* counts) const {
    for (int c = 0; c < kNumPriorityClasses; ++c) {
      for (const Entry& e : queues_[c]) (*counts)[c] += e.tiles.size();
    }
  }

  // Bytes of the tile the next take from class `cls` would start with (0 when it is empty).
  uint64_t FrontTileBytes(int cls) const {
    if (queues_[cls].empty()) return 0;
    const Entry& e = queues_[cls].front();
    return e.tiles.empty() ? 0 : e.job->plan().tile(e.tiles.front()).bytes;
  }

  // Bytes queued in classes [0, up_to_class].
  uint64_t QueuedBytes(int up_to_class) const {
    uint64_t bytes = 0;
    for (int c = 0; c <= up_to_class; ++c) {
      for (const Entry& e : queues_[c]) {
        for (uint32_t t : e.tiles) bytes += e.job->plan().tile(t).bytes;
      }
    }
    return bytes;
  }

  // Takes work from the front job of class `cls` (which must not be empty): `take(job, tiles)`
  // pops what it takes from `tiles` and returns it. The job then goes to the back of its class
  // when tiles remain (round robin), or leaves the queue.
  template <typename Take>
  auto TakeFrom(int cls, Take&& take) {
    auto& queue = queues_[cls];
    Entry& e = queue.front();
    std::shared_ptr<Job> job = e.job;
    auto taken = take(*job, e.tiles);
    if (e.tiles.empty()) {
      queue.pop_front();
    } else if (queue.size() > 1) {
      queue.push_back(std::move(e));
      queue.pop_front();
    }
    return std::make_pair(std::move(job), std::move(taken));
  }

 private:
  struct Entry {
    std::shared_ptr<Job> job;
    std::deque<uint32_t> tiles;
  };
  std::deque<Entry> queues_[kNumPriorityClasses];
};

}  // namespace kvrail::engine
