#include "base/dcheck.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

#include "absl/base/config.h"

namespace kvrail {
namespace {

constexpr InvariantMode kBuildMode =
#if !defined(NDEBUG) || defined(ABSL_HAVE_ADDRESS_SANITIZER) || \
    defined(ABSL_HAVE_THREAD_SANITIZER) || defined(ABSL_HAVE_MEMORY_SANITIZER)
    InvariantMode::kAbort;
#else
    InvariantMode::kCount;
#endif

std::atomic<uint64_t> violations{0};
std::atomic<InvariantMode> mode{kBuildMode};

}  // namespace

InvariantMode BuildInvariantMode() { return kBuildMode; }

uint64_t InvariantViolations() { return violations.load(std::memory_order_relaxed); }

void SetInvariantModeForTest(InvariantMode m) { mode.store(m, std::memory_order_relaxed); }

void InvariantViolated(InvariantSite* site, const char* what) {
  if (mode.load(std::memory_order_relaxed) == InvariantMode::kAbort) {
    // stderr directly: the logger may be what is broken, and abort() must follow at once.
    std::fprintf(stderr, "kvrail: invariant violated at %s:%d: %s (%s)\n", site->file, site->line,
                 site->condition, what);
    std::fflush(stderr);
    std::abort();
  }
  violations.fetch_add(1, std::memory_order_relaxed);
  if (!site->logged.exchange(true, std::memory_order_relaxed)) {
    spdlog::error(
        "invariant violated at {}:{}: {} ({}); counted in kvrail_invariant_violations_total, "
        "logged once per place",
        site->file, site->line, site->condition, what);
  }
}

}  // namespace kvrail
