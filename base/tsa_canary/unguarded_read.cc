// Must NOT compile under --config=tsa: Counter::UnguardedRead reads a field guarded by mu_ without
// holding it. deploy/dev.sh expects clang's "requires holding mutex" error from this file; GCC
// ignores the annotations and compiles it (which is why it is tagged manual, not built by //...).
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvrail::tsa_canary {
namespace {

// Thread contract (deliberately broken): value_ is guarded by mu_, and UnguardedRead ignores it.
class Counter {
 public:
  int UnguardedRead() const { return value_; }

 private:
  mutable absl::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

int ReadWithoutTheLock() { return Counter().UnguardedRead(); }

}  // namespace kvrail::tsa_canary
