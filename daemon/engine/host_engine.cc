#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/engine.h"

namespace kvrail::engine {

const char* PriorityClassName(PriorityClass p) {
  switch (p) {
    case PriorityClass::kCritical: return "critical";
    case PriorityClass::kNormal: return "normal";
    case PriorityClass::kBackground: return "background";
  }
  return "normal";
}

namespace {

// Worker threads pull one tile at a time from the highest non-empty class, so a critical job
// enqueued behind background work starts on the next free worker (tile-level preemption).
class HostEngine final : public Engine {
 public:
  explicit HostEngine(int threads) : threads_(threads < 1 ? 1 : threads) {
    for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
  }

  ~HostEngine() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (auto& t : workers_) t.join();
  }

  std::string name() const override { return "host"; }

  void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) override {
    if (tiles.empty()) return;
    absl::MutexLock lock(&mu_);
    auto& queue = queues_[static_cast<int>(job->priority())];
    for (Entry& e : queue) {
      if (e.job == job) {
        e.tiles.insert(e.tiles.end(), tiles.begin(), tiles.end());
        return;
      }
    }
    queue.push_back(Entry{job, std::deque<uint32_t>(tiles.begin(), tiles.end())});
  }

  size_t Remove(const Job* job) override {
    absl::MutexLock lock(&mu_);
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

  std::vector<uint64_t> QueuedTiles() const override {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> out(kNumPriorityClasses, 0);
    for (int c = 0; c < kNumPriorityClasses; ++c) {
      for (const Entry& e : queues_[c]) out[c] += e.tiles.size();
    }
    return out;
  }

  std::string Describe() const override { return absl::StrCat("host: ", threads_, " threads"); }

 private:
  struct Entry {
    std::shared_ptr<Job> job;
    std::deque<uint32_t> tiles;
  };

  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stop_) return true;
    for (const auto& q : queues_) {
      if (!q.empty()) return true;
    }
    return false;
  }

  void Work() {
    while (true) {
      std::shared_ptr<Job> job;
      uint32_t tile = 0;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &HostEngine::HasWorkOrStop));
        if (stop_) return;
        for (auto& queue : queues_) {
          if (queue.empty()) continue;
          Entry& e = queue.front();
          job = e.job;
          tile = e.tiles.front();
          e.tiles.pop_front();
          if (e.tiles.empty()) {
            queue.pop_front();
          } else if (queue.size() > 1) {
            // Round robin within a class: the job goes to the back after each tile.
            queue.push_back(std::move(e));
            queue.pop_front();
          }
          break;
        }
      }
      job->OnTileStart(tile);
      planner::ExecuteTileHost(job->plan(), tile, job->src_base(), job->dst_base());
      job->OnTileDone(tile, absl::OkStatus());
    }
  }

  const int threads_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Entry> queues_[kNumPriorityClasses] ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<Engine> CreateHostEngine(int threads) {
  return std::make_unique<HostEngine>(threads);
}

}  // namespace kvrail::engine
