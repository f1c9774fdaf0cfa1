// GPU test cases that need GPUs say so instead of passing with nothing tested: a case run with
// fewer GPUs than it needs prints "SKIPPED: <case>: needs N GPU(s), found M" on stdout and
// returns. Catch2 2.13 has no skipped state and counts such a case as passed (no failed
// assertion), so tests/gpu/run.sh counts the SKIPPED lines apart and takes them off the passed
// count: with no GPU every case is skipped and none is reported passed; a two-GPU case on one GPU
// is skipped, never run.
#pragma once

#include <catch2/catch.hpp>
#include <cstdio>

namespace kvrail::gpu_test {

// True when `found` >= `needed`; else prints the SKIPPED line for the running test case.
inline bool HaveGpus(int needed, int found) {
  if (found >= needed) return true;
  std::printf("SKIPPED: %s: needs %d GPU%s, found %d\n",
              Catch::getResultCapture().getCurrentTestName().c_str(), needed,
              needed == 1 ? "" : "s", found);
  std::fflush(stdout);
  return false;
}

}  // namespace kvrail::gpu_test
