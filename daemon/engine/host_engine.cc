#include "daemon/engine/host_engine.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/engine.h"
#include "daemon/planner/table_pool.h"
#include "daemon/scheduler/tile_queues.h"

namespace kvrail::engine {
namespace {

using scheduler::MayStart;
using scheduler::TileQueues;

// Heap table memory kept free for the next plans (as the planner's former process-wide pool).
constexpr uint64_t kRetainedTableBytes = 64 << 20;

// Worker threads pull one tile at a time from the class the scheduler's policy picks (the highest
// runnable one), so a critical job enqueued behind background work starts on the next free worker
// (tile-level preemption). How many workers each class may occupy is
// scheduler::HostClassSlots; a class's max_inflight_bytes further caps the bytes of its tiles
// being copied at once (scheduler::MayStart).
// A small job from EnqueueAdmitted (at most inline_max_bytes) is copied on the admitting thread
// instead: a worker asleep on mu_ takes tens of microseconds to wake on these VMs (more than
// copying a few KiB), and back-to-back small transfers would pay that on every one. It runs only
// where a worker could start it at once (nothing of its class or a higher one queued, a slot and
// the byte limit free), and holds that slot while it runs, so the class limits and the order
// between classes are what the workers keep.
// Thread contract: every public method from any thread; queues and counters under mu_; each
// worker thread, and each admitting thread running a job inline, runs one tile at a time outside
// the lock.
class HostEngine final : public Engine {
 public:
  HostEngine(int threads, const PriorityLimits& limits, uint64_t inline_max_bytes,
             TileLandedHook after_copy = {})
      : threads_(threads < 1 ? 1 : threads),
        inline_max_bytes_(inline_max_bytes),
        class_limits_(limits),
        after_copy_(std::move(after_copy)),
        max_running_(scheduler::HostClassSlots(threads_)),
        tables_(planner::TablePool::Create(planner::TablePool::Heap(), kRetainedTableBytes)) {
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
    absl::MutexLock lock(&mu_);
    queues_.Add(job, tiles);
  }

  void EnqueueAdmitted(const std::shared_ptr<Job>& job,
                       const std::vector<uint32_t>& tiles) override {
    if (tiles.empty()) return;
    uint64_t bytes = 0;
    for (const uint32_t tile : tiles) bytes += job->plan().tile(tile).bytes;
    const int cls = static_cast<int>(job->priority());
    {
      absl::MutexLock lock(&mu_);
      if (!MayRunInline(cls, bytes)) {
        queues_.Add(job, tiles);
        return;
      }
      ++running_[cls];
      inflight_bytes_[cls] += bytes;
    }
    // Not measured for EstimateSeconds: a few KiB say little about a worker's throughput.
    for (const uint32_t tile : tiles) (void)RunTile(*job, tile);
    absl::MutexLock lock(&mu_);
    --running_[cls];
    inflight_bytes_[cls] -= bytes;
  }

  std::optional<double> EstimateSeconds(uint64_t bytes, PriorityClass priority) const override {
    absl::MutexLock lock(&mu_);
    if (measured_tiles_ < kMinMeasuredTiles || tile_bytes_per_second_ <= 0) return std::nullopt;
    const uint64_t ahead = queues_.QueuedBytes(static_cast<int>(priority));
    const double workers = std::min<double>(max_running_[static_cast<int>(priority)],
                                            std::max(1u, std::thread::hardware_concurrency()));
    return static_cast<double>(ahead + bytes) / (tile_bytes_per_second_ * workers);
  }

  size_t Remove(const Job* job) override {
    absl::MutexLock lock(&mu_);
    return queues_.Remove(job);
  }

  void FinishStartedFirst() override {
    absl::MutexLock lock(&mu_);
    queues_.FinishStartedFirst();
  }

  std::vector<uint64_t> QueuedTiles() const override {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> out(kNumPriorityClasses, 0);
    queues_.AddCounts(&out);
    return out;
  }

  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_to_host = true;
    caps.digest = true;
    caps.table_pool = tables_.get();
    return caps;
  }

  std::string Describe() const override {
    absl::MutexLock lock(&mu_);
    return absl::StrCat("host: ", threads_, " threads (background at most ",
                        max_running_[static_cast<int>(PriorityClass::kBackground)], "), ",
                        absl::StrFormat("%.1f", tile_bytes_per_second_ / 1e9), " GB/s per worker");
  }

  std::map<std::string, double> Gauges() const override {
    absl::MutexLock lock(&mu_);
    return {{"threads", static_cast<double>(threads_)},
            {"worker_bytes_per_second", tile_bytes_per_second_}};
  }

 private:
  // A class may start a tile when it has one queued and is below its running and byte limits.
  bool Runnable(int c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queues_.Empty(c) && running_[c] < max_running_[c] &&
           MayStart(class_limits_[c], inflight_bytes_[c], queues_.FrontTileBytes(c));
  }

  // Whether a job of class `cls` and `bytes` may run on the admitting thread now: small, nothing
  // of its class or a higher one (lower index) waiting for a worker, and a slot and the class's
  // byte limit free, as a worker would need to start it.
  bool MayRunInline(int cls, uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stop_ || bytes > inline_max_bytes_) return false;
    for (int c = 0; c <= cls; ++c) {
      if (!queues_.Empty(c)) return false;
    }
    return running_[cls] < max_running_[cls] &&
           MayStart(class_limits_[cls], inflight_bytes_[cls], bytes);
  }

  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stop_) return true;
    for (int c = 0; c < kNumPriorityClasses; ++c) {
      if (Runnable(c)) return true;
    }
    return false;
  }

  void Work() {
    while (true) {
      std::shared_ptr<Job> job;
      uint32_t tile = 0;
      int cls = 0;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &HostEngine::HasWorkOrStop));
        if (stop_) return;
        for (cls = 0; cls < kNumPriorityClasses; ++cls) {
          if (!Runnable(cls)) continue;
          ++running_[cls];
          std::tie(job, tile) = queues_.TakeFrom(cls, [](const Job&, scheduler::TileRanges& tiles) {
            const uint32_t t = tiles.front();
            tiles.pop_front();
            return t;
          });
          inflight_bytes_[cls] += job->plan().tile(tile).bytes;
          break;
        }
      }
      // Reported before the slot is released, so a class's limit holds for its jobs' view too
      // (no new tile of the class starts until this one has been reported done).
      const double seconds = RunTile(*job, tile);
      {
        absl::MutexLock lock(&mu_);
        --running_[cls];
        inflight_bytes_[cls] -= job->plan().tile(tile).bytes;
        const double rate =
            static_cast<double>(job->plan().tile(tile).bytes) / std::max(seconds, 1e-7);
        // Exponential moving average of one worker's throughput.
        tile_bytes_per_second_ =
            measured_tiles_ == 0 ? rate : 0.9 * tile_bytes_per_second_ + 0.1 * rate;
        ++measured_tiles_;
      }
    }
  }

  // Runs one tile and reports it (OnTileStart, OnTileDone); returns the seconds its copy took.
  double RunTile(Job& job, uint32_t tile) const {
    job.OnTileStart(tile);
    // Ids the planner left unchecked are checked before the tile may touch memory (outside the
    // timing below, which measures copying).
    const absl::Status checked = job.plan().CheckTiles(tile, tile + 1);
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status done = checked;
    if (checked.ok() && !job.wants_digest()) {
      planner::ExecuteTileHost(job.plan(), tile, job.src_base(), job.dst_base());
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (checked.ok() && job.wants_digest()) done = CopyWithDigest(job, tile);
    job.OnTileDone(tile, done);
    return seconds;
  }

  // TransferSpec.digest: the host twin copies and hashes the source as it goes, then the
  // destination's bytes are read back and hashed (outside the rate measurement above, which
  // describes plain copies for EstimateSeconds).
  absl::Status CopyWithDigest(Job& job, uint32_t tile) const {
    const uint64_t source =
        planner::ExecuteTileHostWithDigest(job.plan(), tile, job.src_base(), job.dst_base());
    if (after_copy_) after_copy_(job, tile);
    const uint64_t destination = planner::TileDigestHost(job.plan(), tile, job.dst_base(),
                                                         planner::DigestSide::kDestination);
    job.OnTileDigest(tile, source, destination);
    if (source != destination) {
      return planner::DigestMismatchError(job.plan(), tile, source, destination);
    }
    return absl::OkStatus();
  }

  static constexpr uint64_t kMinMeasuredTiles = 8;

  const int threads_;
  const uint64_t inline_max_bytes_;
  const PriorityLimits class_limits_;
  const TileLandedHook after_copy_;
  const std::array<int, kNumPriorityClasses> max_running_;
  const std::shared_ptr<planner::TablePool> tables_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int running_[kNumPriorityClasses] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  uint64_t inflight_bytes_[kNumPriorityClasses] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  double tile_bytes_per_second_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t measured_tiles_ ABSL_GUARDED_BY(mu_) = 0;
  TileQueues queues_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<Engine> CreateHostEngine(int threads, const PriorityLimits& limits,
                                         uint64_t inline_max_bytes) {
  return std::make_unique<HostEngine>(threads, limits, inline_max_bytes);
}

std::unique_ptr<Engine> CreateHostEngineForTest(int threads, TileLandedHook after_copy) {
  return std::make_unique<HostEngine>(threads, PriorityLimits{}, 0, std::move(after_copy));
}

}  // namespace kvrail::engine
