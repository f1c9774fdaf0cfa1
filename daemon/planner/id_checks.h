// Internal to planner/: the per-id checks of block tables (range; destination ids unique), done
// either at once by MakePlan or slice by slice as tiles start (DeferredIdChecks).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvrail::planner {

// A bitmap of the destination block ids seen so far (num_blocks bits).
using SeenBlocks = std::vector<uint64_t>;

// Checks ids[begin, end) of one side: each < num_blocks and, with `seen`, not seen before (in
// this range or an earlier one checked with the same bitmap; `seen` records them). Errors are
// INVALID_ARGUMENT naming "<scope><field>[j]" ("spec." for a request's tables, "post." for a
// prepared transfer's post); a repeat also names its first occurrence (looked up in ids[0, j)
// only once found, so the common case is one pass).
absl::Status CheckIds(const uint32_t* ids, size_t begin, size_t end, uint32_t num_blocks,
                      SeenBlocks* seen, absl::string_view scope, const std::string& field);

// One side of a plan whose checks were deferred.
struct DeferredSide {
  std::shared_ptr<const void> memory;  // holds the plan's table (`ids` points into it)
  const uint32_t* ids = nullptr;
  size_t used = 0;   // entries the plan's tiles read
  size_t given = 0;  // entries the request gave (>= used; the tail is checked last)
  uint32_t num_blocks = 0;
  bool unique = false;
  std::string field;
  std::string scope = "spec.";  // what errors put before `field`
};

// The checks MakePlan left for later. Thread-safe: engines call Through from their dispatch
// threads; one mutex serializes the checking itself (each id is checked once, in table order),
// and a finished or failed state is read without it.
class DeferredIdChecks {
 public:
  DeferredIdChecks(DeferredSide src, DeferredSide dst)
      : src_(std::move(src)), dst_(std::move(dst)) {}

  // Makes sure the first `src_need` / `dst_need` entries of each side have passed (`need` >=
  // used: the whole table, tail included); the first error, every time after it is found.
  absl::Status Through(size_t src_need, size_t dst_need);

 private:
  struct Progress {
    size_t done = 0;
    SeenBlocks seen;
  };
  absl::Status AdvanceLocked(const DeferredSide& side, Progress& progress, size_t need)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DeferredSide src_, dst_;
  absl::Mutex mu_;
  Progress src_progress_ ABSL_GUARDED_BY(mu_);
  Progress dst_progress_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> all_passed_{false};
};

}  // namespace kvrail::planner
