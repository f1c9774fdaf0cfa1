#include "daemon/planner/parallel_table_checks.h"

#include <thread>

namespace kvrail::planner {
namespace {

// Thread contract: thread-safe; each RunBoth call owns the one helper thread it starts and joins
// it before returning.
class ParallelTableChecks final : public TableCheckRunner {
 public:
  explicit ParallelTableChecks(size_t min_ids) : min_ids_(min_ids) {}

  void RunBoth(size_t ids, absl::FunctionRef<void()> src, absl::FunctionRef<void()> dst) override {
    if (ids < min_ids_) {
      src();
      dst();
      return;
    }
    std::thread helper([&src] { src(); });
    dst();
    helper.join();
  }

 private:
  const size_t min_ids_;
};

}  // namespace

std::unique_ptr<TableCheckRunner> CreateParallelTableChecks(size_t min_ids) {
  return std::make_unique<ParallelTableChecks>(min_ids);
}

}  // namespace kvrail::planner
