#include "daemon/readiness/readiness.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/eventually.h"

namespace kvrail::readiness {
namespace {

// The indexes a watch released, in order. Thread-safe: appended on the poller thread, read by the
// test's thread; order_ is guarded by mu_.
class ReleaseLog {
 public:
  void Add(uint32_t index) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    order_.push_back(index);
  }
  std::vector<uint32_t> Order() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return order_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<uint32_t> order_ ABSL_GUARDED_BY(mu_);
};

// Polls `done` until it holds or 10 s passed (the poller thread may wait long for a core on a
// loaded 2-core CI machine: a bound on the time it takes is not what these tests check).
template <typename Done>
bool WaitUntil(Done done) {
  return Eventually(done, absl::Seconds(10), absl::Microseconds(50));
}

TEST_CASE("epoch comparison wraps") {
  CHECK(Reached(5, 5));
  CHECK(Reached(6, 5));
  CHECK(!Reached(4, 5));
  CHECK(Reached(2, 0xFFFFFFF0u));   // wrapped past the value
  CHECK(!Reached(0xFFFFFFF0u, 2));  // far behind
  CHECK(!Reached(0, 1));
}

TEST_CASE("layers are released in the order their flags are written, once each") {
  auto watcher = FlagWatcher::Create(absl::Microseconds(20));
  std::vector<uint32_t> flags(8, 6);  // last transfer's epoch was 6
  ReleaseLog log;
  auto handle = watcher->Watch(flags.data(), 8, 7, [&](uint32_t i) { log.Add(i); });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(log.Order().empty());  // old epochs do not count
  for (uint32_t layer : {3u, 0u, 7u, 1u, 2u, 6u, 5u, 4u}) {
    SignalFlag(flags.data(), layer, 7);
    // Released before the next flag is written (else one poll could see two and order them by
    // index, and the order below would be a matter of scheduling).
    INFO("layer " << layer);
    REQUIRE(WaitUntil([&] {
      const std::vector<uint32_t> order = log.Order();
      return !order.empty() && order.back() == layer;
    }));
  }
  SignalFlag(flags.data(), 3, 8);  // a later epoch on a fired index does not fire again
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  handle.reset();
  CHECK(log.Order() == std::vector<uint32_t>{3, 0, 7, 1, 2, 6, 5, 4});
  CHECK(watcher->active_watches() == 0);
}

TEST_CASE("destroying a handle stops its callbacks; other watches go on") {
  auto watcher = FlagWatcher::Create(absl::Microseconds(10));
  std::vector<uint32_t> a(2, 0), b(2, 0);
  std::atomic<int> a_calls{0}, b_calls{0};
  auto ha = watcher->Watch(a.data(), 2, 1, [&](uint32_t) { ++a_calls; });
  auto hb = watcher->Watch(b.data(), 2, 1, [&](uint32_t) { ++b_calls; });
  ha.reset();
  SignalFlag(a.data(), 0, 1);
  SignalFlag(b.data(), 1, 1);
  REQUIRE(WaitUntil([&] { return b_calls > 0; }));
  CHECK(b_calls == 1);
  CHECK(a_calls == 0);
}

}  // namespace
}  // namespace kvrail::readiness
