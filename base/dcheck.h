// KVRAIL_DCHECK: an invariant the code relies on, checked where a violation would otherwise pass
// unseen (a value clamped back into its bound, a count that cannot go negative).
//
//   KVRAIL_DCHECK(launched <= count, "gate launches past its words");
//   launched = std::min(launched, count);  // what release builds keep doing after counting it
//
// Debug and sanitizer builds (no NDEBUG, or ASan/TSan): a violation prints the condition, `what`
// and file:line to stderr and aborts, so a test that reaches it fails at the cause.
// Release builds (-c opt defines NDEBUG): a violation adds one to InvariantViolations(), exported
// as kvrail_invariant_violations_total, logs at error once per call site (the first time; later
// ones only count), and execution goes on; the code after the check must stay safe without it.
// The condition is evaluated in every build (it must have no side effects and be cheap).
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/base/optimization.h"

namespace kvrail {

// One KVRAIL_DCHECK's place in the source; `logged` makes release builds log it once.
struct InvariantSite {
  const char* file;
  int line;
  const char* condition;
  std::atomic<bool> logged{false};
};

enum class InvariantMode {
  kAbort,  // debug and sanitizer builds
  kCount,  // release builds
};

// This build's mode (kAbort unless NDEBUG is defined and no sanitizer is on).
InvariantMode BuildInvariantMode();

// Thread-safe. Violations seen by this process in kCount mode.
uint64_t InvariantViolations();

// Reports a violation at `site` (the macro calls it; `what` says which invariant, in words).
void InvariantViolated(InvariantSite* site, const char* what);

// Tests only: run the other mode than the build's, to test both in one binary. Not thread-safe
// against concurrent violations; set it before the code under test runs.
void SetInvariantModeForTest(InvariantMode mode);

}  // namespace kvrail

#define KVRAIL_DCHECK(condition, what)                                                   \
  do {                                                                                   \
    if (ABSL_PREDICT_FALSE(!(condition))) {                                              \
      static ::kvrail::InvariantSite kvrail_dcheck_site{__FILE__, __LINE__, #condition}; \
      ::kvrail::InvariantViolated(&kvrail_dcheck_site, (what));                          \
    }                                                                                    \
  } while (false)
