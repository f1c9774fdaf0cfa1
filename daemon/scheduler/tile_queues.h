// Scheduling policy shared by the host and CUDA engines (pure: no threads, no clocks, no CUDA):
// the queued tiles of jobs, one queue of jobs per priority class (higher class first, re-chosen
// at every take: preemption at tile or batch granularity; within a class round robin or fewest
// queued tiles first, see WithinClass), and which class may start more work (MayStart,
// HostClassSlots). The engines only execute what these decide.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "daemon/job/job.h"
#include "daemon/scheduler/tile_ranges.h"

namespace kvrail::scheduler {

using job::ClassLimits;
using job::Job;
using job::kNumPriorityClasses;
using job::PriorityClass;

// Whether a class with `inflight` bytes being moved may start `next` more under `limit`.
inline bool MayStart(const ClassLimits& limit, uint64_t inflight, uint64_t next) {
  return limit.max_inflight_bytes == 0 || inflight == 0 ||
         inflight + next <= limit.max_inflight_bytes;
}

// How many of the host engine's `threads` workers each class may occupy at once: critical and
// normal all of them, background at most threads - 1 (one worker is always free for critical and
// normal work, so background traffic only fills idle time; FIKIT's idea, at tile grain). A
// single worker is shared by every class.
inline std::array<int, kNumPriorityClasses> HostClassSlots(int threads) {
  threads = threads < 1 ? 1 : threads;
  std::array<int, kNumPriorityClasses> slots{};
  slots[static_cast<int>(PriorityClass::kCritical)] = threads;
  slots[static_cast<int>(PriorityClass::kNormal)] = threads;
  slots[static_cast<int>(PriorityClass::kBackground)] = threads > 1 ? threads - 1 : 1;
  return slots;
}

// How a class's jobs share the engine.
enum class WithinClass {
  // Each take rotates to the next job: jobs of a class progress together (and end together).
  kRoundRobin,
  // Each take serves the job with the fewest queued tiles (the earliest of equals): a short
  // transfer passes a long one at the next batch, and back-to-back transfers of one size run one
  // after the other instead of sharing the GPU and ending together. (Measured alone, the
  // sustained two-in-flight rate did not change: docs/benchmarks.md, "Fifth session".)
  kFewestTilesFirst,
};

// Not thread-safe: the owning engine guards it with its own lock.
class TileQueues {
 public:
  explicit TileQueues(WithinClass within = WithinClass::kRoundRobin) : within_(within) {}

  // Appends `tiles` to the job's entry in its class (a new entry goes to the back).
  void Add(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) {
    if (tiles.empty()) return;
    auto& queue = queues_[static_cast<int>(job->priority())];
    for (Entry& e : queue) {
      if (e.job == job) {
        e.tiles.insert_back(tiles.begin(), tiles.end());
        return;
      }
    }
    queue.push_back(Entry{job, TileRanges(tiles.begin(), tiles.end())});
  }

  // The drain's order from now on (Engine::FinishStartedFirst): each take serves a started job
  // (one that had tiles taken before) ahead of any job not started, the one with the fewest
  // queued tiles first, and stays with it until it has none queued - no other job's tiles are
  // interleaved. Higher classes still come first.
  void FinishStartedFirst() { finish_started_first_ = true; }

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
    const Entry& e = queues_[cls][Next(cls)];
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

  // Takes work from the next job of class `cls` (which must not be empty): `take(job, tiles)`
  // pops what it takes from `tiles` and returns it. A job with no tiles left leaves the queue;
  // otherwise, round robin sends it to the back of its class.
  template <typename Take>
  auto TakeFrom(int cls, Take&& take) {
    auto& queue = queues_[cls];
    const size_t at = Next(cls);
    Entry& e = queue[at];
    std::shared_ptr<Job> job = e.job;
    auto taken = take(*job, e.tiles);
    e.started = true;
    if (e.tiles.empty()) {
      queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(at));
    } else if (within_ == WithinClass::kRoundRobin && !finish_started_first_ && queue.size() > 1) {
      queue.push_back(std::move(e));
      queue.pop_front();
    }
    return std::make_pair(std::move(job), std::move(taken));
  }

 private:
  // Index of the job the next take of class `cls` serves (the queue must not be empty).
  size_t Next(int cls) const {
    if (within_ == WithinClass::kRoundRobin && !finish_started_first_) return 0;
    const auto& queue = queues_[cls];
    size_t best = 0;
    for (size_t i = 1; i < queue.size(); ++i) {
      const Entry& a = queue[i];
      const Entry& b = queue[best];
      if (finish_started_first_ && a.started != b.started) {
        if (a.started) best = i;
      } else if (a.tiles.size() < b.tiles.size()) {
        best = i;
      }
    }
    return best;
  }

  struct Entry {
    std::shared_ptr<Job> job;
    TileRanges tiles;      // ranges, not one entry per tile: a 2^20-tile transfer is one range
    bool started = false;  // tiles were taken from it
  };
  const WithinClass within_;
  bool finish_started_first_ = false;
  std::deque<Entry> queues_[kNumPriorityClasses];
};

}  // namespace kvrail::scheduler
