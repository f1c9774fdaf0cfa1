// Proof that the --config=tsan build really finds races (deploy/dev.sh runs it and expects a
// report): two threads bump a counter guarded by an absl::Mutex (the shim must make this quiet),
// then two threads bump another counter with no lock at all (TSan must report it and exit 66).
#include <cstdio>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace {
absl::Mutex mu;
int guarded = 0;
int unguarded = 0;
}  // namespace

int main() {
  auto locked = [] {
    for (int i = 0; i < 10000; ++i) {
      absl::MutexLock lock(&mu);
      ++guarded;
    }
  };
  std::thread a(locked), b(locked);
  a.join();
  b.join();
  auto racy = [] {
    for (int i = 0; i < 10000; ++i) ++unguarded;
  };
  std::thread c(racy), d(racy);
  c.join();
  d.join();
  std::printf("guarded %d unguarded %d\n", guarded, unguarded);
  return 0;
}
