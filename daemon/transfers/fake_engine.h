// A hand-driven engine for the transfers module's tests: it records the tiles it is given and
// runs nothing until the test says so (Start, Finish, Fail). Keeps the Engine contract: a tile
// reports once (OnTileDone) unless Remove took it off the queue first.
#pragma once

#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/engine.h"

namespace kvrail::transfers::testing {

// Thread-safe. Tiles are identified by (job, tile); a test usually has one job in flight and
// drives it with the *Next helpers.
// Heap table memory that counts what it hands out (where the manager's plans took their tables).
class CountingTables final : public planner::TableAllocator {
 public:
  Memory Take(size_t bytes) override {
    absl::MutexLock lock(&mu_);
    ++taken_;
    return Memory{
        std::shared_ptr<void>(::operator new(bytes), [](void* p) { ::operator delete(p); }), false};
  }
  size_t taken() const {
    absl::MutexLock lock(&mu_);
    return taken_;
  }

 private:
  mutable absl::Mutex mu_;
  size_t taken_ ABSL_GUARDED_BY(mu_) = 0;
};

class FakeEngine final : public engine::Engine {
 public:
  std::string name() const override { return "fake"; }
  void Enqueue(const std::shared_ptr<engine::Job>& job,
               const std::vector<uint32_t>& tiles) override {
    absl::MutexLock lock(&mu_);
    for (uint32_t t : tiles) queued_.push_back({job, t});
    enqueued_ += tiles.size();
  }
  // What an admission hands over (Engine::EnqueueAdmitted): counted, then queued as Enqueue's
  // tiles, or with set_run_admitted(true) run to their report on the calling thread, as the host
  // engine runs a small job.
  void EnqueueAdmitted(const std::shared_ptr<engine::Job>& job,
                       const std::vector<uint32_t>& tiles) override {
    bool run = false;
    {
      absl::MutexLock lock(&mu_);
      admitted_ += tiles.size();
      run = run_admitted_;
    }
    if (!run) {
      Enqueue(job, tiles);
      return;
    }
    for (const uint32_t tile : tiles) {
      job->OnTileStart(tile);
      if (job->dst_base() != nullptr && job->src_base() != nullptr) {
        planner::ExecuteTileHost(job->plan(), tile, job->src_base(), job->dst_base());
      }
      job->OnTileDone(tile, absl::OkStatus());
    }
  }
  void set_run_admitted(bool run) {
    absl::MutexLock lock(&mu_);
    run_admitted_ = run;
  }
  // Tiles handed over by EnqueueAdmitted (whether queued or run there).
  size_t admitted() const {
    absl::MutexLock lock(&mu_);
    return admitted_;
  }
  size_t Remove(const engine::Job* job) override {
    absl::MutexLock lock(&mu_);
    const auto before = queued_.size();
    queued_.erase(std::remove_if(queued_.begin(), queued_.end(),
                                 [job](const Entry& e) { return e.job.get() == job; }),
                  queued_.end());
    removed_ += before - queued_.size();
    return before - queued_.size();
  }
  std::vector<uint64_t> QueuedTiles() const override {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> out(engine::kNumPriorityClasses, 0);
    for (const Entry& e : queued_) ++out[static_cast<int>(e.job->priority())];
    return out;
  }
  std::string Describe() const override { return "fake"; }
  // Host memory, gated admission offered (set_admit_gated decides), digest, its own tables.
  engine::Capabilities capabilities() const override {
    engine::Capabilities caps;
    caps.host_to_host = true;
    caps.gated_admission = true;
    caps.digest = true;
    caps.table_pool = &tables_;
    return caps;
  }
  // The GPU-side readiness wait (Engine::AdmitGated): admitted when set_admit_gated(true).
  bool AdmitGated(const std::shared_ptr<engine::Job>& job) override {
    absl::MutexLock lock(&mu_);
    if (admit_gated_) ++admitted_gated_;
    return admit_gated_;
  }
  void set_admit_gated(bool admit) {
    absl::MutexLock lock(&mu_);
    admit_gated_ = admit;
  }
  size_t admitted_gated() const {
    absl::MutexLock lock(&mu_);
    return admitted_gated_;
  }
  // Plans whose block tables came from this engine's table pool.
  size_t tables_taken() const { return tables_.taken(); }

  // Starts the oldest queued tile (OnTileStart) and returns it as running; false when none.
  bool StartNext(std::shared_ptr<engine::Job>* job = nullptr, uint32_t* tile = nullptr) {
    Entry e;
    {
      absl::MutexLock lock(&mu_);
      if (queued_.empty()) return false;
      e = queued_.front();
      queued_.pop_front();
      running_.push_back(e);
    }
    e.job->OnTileStart(e.tile);
    if (job != nullptr) *job = e.job;
    if (tile != nullptr) *tile = e.tile;
    return true;
  }
  // Reports the oldest running tile with `status` (moving its bytes first when OK and the job has
  // host memory); false when none runs.
  bool FinishNext(const absl::Status& status = absl::OkStatus()) {
    Entry e;
    {
      absl::MutexLock lock(&mu_);
      if (running_.empty()) return false;
      e = running_.front();
      running_.pop_front();
      ++reported_;
    }
    if (status.ok() && e.job->dst_base() != nullptr && e.job->src_base() != nullptr) {
      planner::ExecuteTileHost(e.job->plan(), e.tile, e.job->src_base(), e.job->dst_base());
    }
    e.job->OnTileDone(e.tile, status);
    return true;
  }
  // Starts and finishes every queued tile, one at a time.
  void RunAll() {
    while (StartNext()) FinishNext();
  }

  size_t queued() const {
    absl::MutexLock lock(&mu_);
    return queued_.size();
  }
  size_t running() const {
    absl::MutexLock lock(&mu_);
    return running_.size();
  }
  size_t enqueued() const {
    absl::MutexLock lock(&mu_);
    return enqueued_;
  }
  size_t removed() const {
    absl::MutexLock lock(&mu_);
    return removed_;
  }
  size_t reported() const {
    absl::MutexLock lock(&mu_);
    return reported_;
  }

 private:
  mutable CountingTables tables_;
  struct Entry {
    std::shared_ptr<engine::Job> job;
    uint32_t tile = 0;
  };
  mutable absl::Mutex mu_;
  std::deque<Entry> queued_ ABSL_GUARDED_BY(mu_);
  std::deque<Entry> running_ ABSL_GUARDED_BY(mu_);
  size_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  size_t removed_ ABSL_GUARDED_BY(mu_) = 0;
  size_t reported_ ABSL_GUARDED_BY(mu_) = 0;
  bool admit_gated_ ABSL_GUARDED_BY(mu_) = false;
  size_t admitted_gated_ ABSL_GUARDED_BY(mu_) = 0;
  size_t admitted_ ABSL_GUARDED_BY(mu_) = 0;
  bool run_admitted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvrail::transfers::testing
