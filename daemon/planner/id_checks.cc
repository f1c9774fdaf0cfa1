#include "daemon/planner/id_checks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvrail::planner {

absl::Status CheckIds(const uint32_t* ids, size_t begin, size_t end, uint32_t num_blocks,
                      SeenBlocks* seen, absl::string_view scope, const std::string& field) {
  if (seen == nullptr) {
    // A maximum vectorizes; the index is looked for only when one is out of range.
    uint32_t max = 0;
    for (size_t j = begin; j < end; ++j) max = std::max(max, ids[j]);
    if (begin == end || max < num_blocks) return absl::OkStatus();
  }
  // Predictable branches let the bitmap's read-modify-writes overlap (a branch-free variant that
  // only accumulated was slower: its updates serialize).
  for (size_t j = begin; j < end; ++j) {
    const uint32_t b = ids[j];
    if (b >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(scope, field, "[", j, "]: block ", b,
                                                     " out of range [0, ", num_blocks, ")"));
    }
    if (seen == nullptr) continue;
    uint64_t& word = (*seen)[b / 64];
    const uint64_t bit = uint64_t{1} << (b % 64);
    if ((word & bit) != 0) {
      size_t first = 0;
      while (ids[first] != b) ++first;
      return absl::InvalidArgumentError(absl::StrCat(scope, field, "[", j, "]: block ", b,
                                                     " repeats ", scope, field, "[", first,
                                                     "]: two tokens would land on the same bytes"));
    }
    word |= bit;
  }
  return absl::OkStatus();
}

absl::Status DeferredIdChecks::Through(size_t src_need, size_t dst_need) {
  if (all_passed_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  // Source before destination, as MakePlan reports them.
  error_ = AdvanceLocked(src_, src_progress_, src_need);
  if (error_.ok()) error_ = AdvanceLocked(dst_, dst_progress_, dst_need);
  if (error_.ok() && src_progress_.done == src_.given && dst_progress_.done == dst_.given) {
    all_passed_.store(true, std::memory_order_release);
  }
  return error_;
}

absl::Status DeferredIdChecks::AdvanceLocked(const DeferredSide& side, Progress& progress,
                                             size_t need) {
  // Reaching the used entries' end also checks the tail the tiles never read: the verdict on a
  // request does not depend on how its tiles were cut.
  need = need >= side.used ? side.given : need;
  if (need <= progress.done) return absl::OkStatus();
  if (side.unique && progress.seen.empty()) {
    progress.seen.assign((static_cast<size_t>(side.num_blocks) + 63) / 64, 0);
  }
  const absl::Status status =
      CheckIds(side.ids, progress.done, need, side.num_blocks,
               side.unique ? &progress.seen : nullptr, side.scope, side.field);
  if (status.ok()) progress.done = need;
  return status;
}

}  // namespace kvrail::planner
