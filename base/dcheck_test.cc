#include "base/dcheck.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <sstream>
#include <string>

#include "absl/base/config.h"
#include "base/logging.h"

namespace kvrail {
namespace {

// Two call sites of their own, so each test sees a site that has not logged yet.
void CheckBoundA(int value, int bound) { KVRAIL_DCHECK(value <= bound, "a value past its bound"); }
void CheckBoundB(int value, int bound) { KVRAIL_DCHECK(value <= bound, "another bound"); }

int CountLines(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST_CASE("the build's mode: abort without NDEBUG or under a sanitizer, count in release") {
#if defined(NDEBUG) && !defined(ABSL_HAVE_ADDRESS_SANITIZER) && \
    !defined(ABSL_HAVE_THREAD_SANITIZER) && !defined(ABSL_HAVE_MEMORY_SANITIZER)
  CHECK(BuildInvariantMode() == InvariantMode::kCount);
#else
  CHECK(BuildInvariantMode() == InvariantMode::kAbort);
#endif
}

TEST_CASE("release mode: a violation counts, logs once per site at error, and returns") {
  std::ostringstream log;
  REQUIRE(SetUpLoggingTo("info", "text", /*journald=*/false, &log).ok());
  SetInvariantModeForTest(InvariantMode::kCount);
  const uint64_t before = InvariantViolations();
  CheckBoundA(1, 2);  // holds: nothing counted
  CHECK(InvariantViolations() == before);
  CheckBoundA(3, 2);
  CheckBoundA(4, 2);
  CHECK(InvariantViolations() == before + 2);
  CHECK(CountLines(log.str(), "value <= bound (a value past its bound)") == 1);
  CHECK(CountLines(log.str(), "error") == 1);
  CheckBoundB(5, 2);
  CHECK(InvariantViolations() == before + 3);
  CHECK(CountLines(log.str(), "(another bound)") == 1);
  CHECK(log.str().find("dcheck_test.cc:") != std::string::npos);
  SetInvariantModeForTest(BuildInvariantMode());
}

TEST_CASE("debug mode: a violation aborts the process, naming the condition") {
  int err[2];
  REQUIRE(::pipe(err) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::dup2(err[1], 2);
    SetInvariantModeForTest(InvariantMode::kAbort);
    CheckBoundA(1, 2);  // holds: goes on
    CheckBoundA(3, 2);
    ::_exit(0);  // not reached when the check aborts
  }
  ::close(err[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof(buf))) > 0;) text.append(buf, n);
  ::close(err[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  CHECK(text.find("invariant violated at") != std::string::npos);
  CHECK(text.find("value <= bound (a value past its bound)") != std::string::npos);
}

}  // namespace
}  // namespace kvrail
