#include "daemon/readiness/readiness.h"

#include <sys/prctl.h>

#include <atomic>
#include <list>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace kvrail::readiness {

void SignalFlag(uint32_t* words, uint32_t index, uint32_t value) {
  __atomic_store_n(&words[index], value, __ATOMIC_RELEASE);
}

namespace {

class FlagWatcherImpl;

// One watch. Lives in FlagWatcherImpl::entries_ and is read and written only under its mu_.
struct Entry {
  const volatile uint32_t* words;
  uint32_t count;
  uint32_t value;
  std::function<void(uint32_t)> on_ready;
  std::vector<bool> fired;
  uint32_t remaining;
};

// Thread-compatible: destroyed once, on any thread but the poller's (its destructor takes the
// watcher's lock, which the poller holds while it runs callbacks).
class HandleImpl final : public WatchHandle {
 public:
  HandleImpl(FlagWatcherImpl* owner, std::list<Entry>::iterator it) : owner_(owner), it_(it) {}
  ~HandleImpl() override;

 private:
  FlagWatcherImpl* const owner_;
  const std::list<Entry>::iterator it_;
};

// Thread-safe: entries_ and stop_ are guarded by mu_; thread_ is touched only by the constructor
// and destructor. Sweeps every watch; sleeps `poll_interval` between sweeps that found nothing
// new. Callbacks run with `mu_` held, so a handle's destructor (which takes `mu_`) returns only
// when its callback is not running.
class FlagWatcherImpl final : public FlagWatcher {
 public:
  explicit FlagWatcherImpl(absl::Duration poll_interval) : poll_interval_(poll_interval) {
    thread_ = std::thread([this] {
      // Linux adds up to 50 us of timer slack to every sleep by default, which would more than
      // triple a 20 us poll interval; this thread's sleeps are its latency.
      ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
      Loop();
    });
  }
  ~FlagWatcherImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  std::unique_ptr<WatchHandle> Watch(const volatile uint32_t* words, uint32_t count, uint32_t value,
                                     std::function<void(uint32_t)> on_ready) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    entries_.push_back(
        Entry{words, count, value, std::move(on_ready), std::vector<bool>(count, false), count});
    return std::make_unique<HandleImpl>(this, std::prev(entries_.end()));
  }

  size_t active_watches() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return entries_.size();
  }

  void Erase(std::list<Entry>::iterator it) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    entries_.erase(it);
  }

 private:
  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !entries_.empty();
  }

  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (true) {
      mu_.Await(absl::Condition(this, &FlagWatcherImpl::HasWorkOrStop));
      if (stop_) return;
      bool progressed = false;
      for (Entry& e : entries_) {
        if (e.remaining == 0) continue;
        for (uint32_t i = 0; i < e.count; ++i) {
          if (e.fired[i]) continue;
          const uint32_t word =
              __atomic_load_n(const_cast<const uint32_t*>(&e.words[i]), __ATOMIC_ACQUIRE);
          if (!Reached(word, e.value)) continue;
          e.fired[i] = true;
          --e.remaining;
          progressed = true;
          e.on_ready(i);
        }
      }
      if (!progressed) {
        mu_.Unlock();
        absl::SleepFor(poll_interval_);
        mu_.Lock();
      }
    }
  }

  const absl::Duration poll_interval_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // the poller, running Loop()
};

HandleImpl::~HandleImpl() { owner_->Erase(it_); }

}  // namespace

std::unique_ptr<FlagWatcher> FlagWatcher::Create(absl::Duration poll_interval) {
  return std::make_unique<FlagWatcherImpl>(poll_interval);
}

}  // namespace kvrail::readiness
