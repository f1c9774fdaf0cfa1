#include "daemon/engine/fault_engine.h"

#include <algorithm>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kvrail::engine {

FaultPolicy FailEveryNth(uint64_t n, absl::Status status) {
  return [n, status](const TileRef& t) {
    return n > 0 && (t.tile_ordinal + 1) % n == 0 ? Fault::Fail(status) : Fault::None();
  };
}

FaultPolicy FailTiles(uint64_t job_ordinal, std::vector<uint32_t> tiles, absl::Status status) {
  return [job_ordinal, tiles = std::move(tiles), status](const TileRef& t) {
    const bool chosen = t.job_ordinal == job_ordinal &&
                        std::find(tiles.begin(), tiles.end(), t.tile) != tiles.end();
    return chosen ? Fault::Fail(status) : Fault::None();
  };
}

namespace {

// One worker thread reports failed tiles and hands due delayed tiles on. A tile leaves `pending_`
// under mu_ either to the worker (which then reports or forwards it) or to Remove (which counts
// it), never both: that is the exactly-once contract.
class FaultInjectingEngineImpl final : public FaultInjectingEngine {
 public:
  FaultInjectingEngineImpl(Engine* inner, FaultPolicy policy, Clock* clock)
      : inner_(inner),
        clock_(clock != nullptr ? clock : Clock::Real()),
        policy_(std::move(policy)) {
    worker_ = std::thread([this] { Work(); });
  }
  ~FaultInjectingEngineImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    worker_.join();
  }

  std::string name() const override { return inner_->name(); }

  void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) override {
    std::vector<uint32_t> pass;
    {
      absl::MutexLock lock(&mu_);
      const uint64_t job_ordinal = OrdinalLocked(job);
      for (uint32_t tile : tiles) {
        const Fault fault =
            policy_ ? policy_(TileRef{job.get(), job_ordinal, tile, next_tile_++}) : Fault::None();
        if (fault.kind == Fault::Kind::kNone) {
          pass.push_back(tile);
          continue;
        }
        Pending p{job, tile, fault.kind == Fault::Kind::kFail, fault.status,
                  fault.kind == Fault::Kind::kDelay ? clock_->Now() + fault.delay
                                                    : absl::InfiniteFuture()};
        pending_.push_back(std::move(p));
      }
    }
    if (!pass.empty()) inner_->Enqueue(job, pass);
  }

  size_t Remove(const Job* job) override {
    size_t removed = 0;
    {
      absl::MutexLock lock(&mu_);
      const size_t before = pending_.size();
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                    [job](const Pending& p) { return p.job.get() == job; }),
                     pending_.end());
      removed = before - pending_.size();
    }
    return removed + inner_->Remove(job);
  }

  std::vector<uint64_t> QueuedTiles() const override {
    std::vector<uint64_t> out = inner_->QueuedTiles();
    out.resize(kNumPriorityClasses, 0);
    absl::MutexLock lock(&mu_);
    for (const Pending& p : pending_) ++out[static_cast<int>(p.job->priority())];
    return out;
  }

  std::optional<double> EstimateSeconds(uint64_t bytes, PriorityClass priority) const override {
    return inner_->EstimateSeconds(bytes, priority);
  }
  std::string Describe() const override {
    absl::MutexLock lock(&mu_);
    return absl::StrCat("fault-injecting (", failed_, " failed, ", pending_.size(), " held) over ",
                        inner_->Describe());
  }
  // The inner engine's, but gated admission: AdmitGated is not passed on.
  Capabilities capabilities() const override {
    Capabilities caps = inner_->capabilities();
    caps.gated_admission = false;
    return caps;
  }
  void Expect(const Placement& src, const Placement& dst) override { inner_->Expect(src, dst); }

  void SetPolicy(FaultPolicy policy) override {
    absl::MutexLock lock(&mu_);
    policy_ = std::move(policy);
  }
  void ReleaseHeld() override {
    absl::MutexLock lock(&mu_);
    for (Pending& p : pending_) {
      if (!p.fail) p.due = absl::InfinitePast();
    }
  }
  size_t held() const override {
    absl::MutexLock lock(&mu_);
    return static_cast<size_t>(
        std::count_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.fail; }));
  }
  uint64_t failed() const override {
    absl::MutexLock lock(&mu_);
    return failed_;
  }

 private:
  struct Pending {
    std::shared_ptr<Job> job;
    uint32_t tile = 0;
    bool fail = false;  // else held until `due`
    absl::Status status;
    absl::Time due;
  };

  uint64_t OrdinalLocked(const std::shared_ptr<Job>& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_.find(job.get());
    // A pointer seen before may belong to a new job (the old one freed): then it is a new job.
    if (it != jobs_.end() && it->second.first.lock() == job) return it->second.second;
    jobs_[job.get()] = {job, next_job_};
    return next_job_++;
  }

  // Takes the entries whose time has come: every failure, and held tiles that are due.
  std::vector<Pending> TakeReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Pending> ready;
    const absl::Time now = clock_->Now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->fail || it->due <= now) {
        if (it->fail) ++failed_;  // counted as taken, so failed() is right once it has reported
        ready.push_back(std::move(*it));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    return ready;
  }

  void Work() {
    while (true) {
      std::vector<Pending> ready;
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
        ready = TakeReadyLocked();
        if (ready.empty()) {
          // Held tiles are due by the (possibly manual) clock: look again every millisecond.
          auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stop_ || std::any_of(pending_.begin(), pending_.end(), [](const Pending& p) {
                     return p.fail || p.due == absl::InfinitePast();
                   });
          };
          mu_.AwaitWithTimeout(absl::Condition(&woken), absl::Milliseconds(1));
          continue;
        }
      }
      for (Pending& p : ready) {
        if (p.fail) {
          p.job->OnTileStart(p.tile);
          p.job->OnTileDone(p.tile, p.status);
        } else {
          inner_->Enqueue(p.job, {p.tile});
        }
      }
    }
  }

  Engine* const inner_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  FaultPolicy policy_ ABSL_GUARDED_BY(mu_);
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::map<const Job*, std::pair<std::weak_ptr<Job>, uint64_t>> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_tile_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<FaultInjectingEngine> FaultInjectingEngine::Create(Engine* inner,
                                                                   FaultPolicy policy,
                                                                   Clock* clock) {
  return std::make_unique<FaultInjectingEngineImpl>(inner, std::move(policy), clock);
}

}  // namespace kvrail::engine
