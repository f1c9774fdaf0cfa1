#include "base/cuda/context_sync.h"

#include <map>

#include "absl/synchronization/mutex.h"

namespace kvrail::cuda {
namespace {

struct Registry {
  absl::Mutex mu;
  uint64_t next ABSL_GUARDED_BY(mu) = 1;
  // Ids grow with time, so the first entry is the oldest scope.
  std::map<uint64_t, OpenContextSync> open ABSL_GUARDED_BY(mu);
  absl::Time (*now)() ABSL_GUARDED_BY(mu) = nullptr;
};

Registry& Reg() {
  static Registry* registry = new Registry();  // never destroyed: scopes may close at exit
  return *registry;
}

}  // namespace

ContextSyncScope::ContextSyncScope(const char* what) {
  Registry& r = Reg();
  absl::MutexLock lock(&r.mu);
  id_ = r.next++;
  r.open[id_] = OpenContextSync{r.now != nullptr ? r.now() : absl::Now(), what, 0};
}

ContextSyncScope::~ContextSyncScope() {
  Registry& r = Reg();
  absl::MutexLock lock(&r.mu);
  r.open.erase(id_);
}

std::optional<OpenContextSync> OldestContextSync() {
  Registry& r = Reg();
  absl::MutexLock lock(&r.mu);
  if (r.open.empty()) return std::nullopt;
  OpenContextSync oldest = r.open.begin()->second;
  oldest.open = static_cast<int>(r.open.size());
  return oldest;
}

void SetContextSyncClockForTest(absl::Time (*now)()) {
  Registry& r = Reg();
  absl::MutexLock lock(&r.mu);
  r.now = now;
}

}  // namespace kvrail::cuda
