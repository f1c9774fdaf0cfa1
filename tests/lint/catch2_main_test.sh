#!/bin/bash
# Catch2's main is compiled once per build configuration (//third_party/system:catch2_main), not
# in each test file: a test file defining CATCH_CONFIG_MAIN compiles Catch2's whole
# implementation again (15-20 s of CPU per file with GCC -O2 or clang ASan -O0, most of a test
# file's compile), which made up most of CI's build time on two cores. The check first shows it
# finds such a file, then reads the checkout the runfiles link back to.
set -u
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Tracked C++ and CUDA sources of the checkout at $1 that define CATCH_CONFIG_MAIN, but the main's.
defining() {
  git -C "$1" grep -l -E '^[[:space:]]*#[[:space:]]*define[[:space:]]+CATCH_CONFIG_MAIN' -- \
    '*.cc' '*.cpp' '*.cu' ':!third_party/system/catch2_main.cc'
}
mkdir -p "$tmp/repo/third_party/system"
printf '#define CATCH_CONFIG_MAIN\n#include <catch2/catch.hpp>\n' > "$tmp/repo/own_main_test.cc"
printf '#include <catch2/catch.hpp>\n' > "$tmp/repo/shared_main_test.cc"
cp "$tmp/repo/own_main_test.cc" "$tmp/repo/third_party/system/catch2_main.cc"
git -C "$tmp/repo" init -q && git -C "$tmp/repo" add -A
if [ "$(defining "$tmp/repo")" = "own_main_test.cc" ]; then
  echo "ok   a test file with its own main is found; catch2_main.cc and a test without are not"
else
  echo "FAIL the check does not find own_main_test.cc alone"
  fail=1
fi
# The project itself (a git checkout; CI runs from one).
src=$(dirname "$(dirname "$(dirname "$(readlink -f "$dir/tests/lint/catch2_main_test.sh")")")")
if [ -e "$src/.git" ] && command -v git > /dev/null; then
  found=$(defining "$src")
  if [ -z "$found" ]; then
    echo "ok   no test file defines CATCH_CONFIG_MAIN"
  else
    printf '%s\n' "$found"
    echo "FAIL the files above define CATCH_CONFIG_MAIN: drop the define and depend on //third_party/system:catch2_main"
    fail=1
  fi
else
  echo "FAIL the source checkout is not reachable from the runfiles ($src): run from a git checkout"
  fail=1
fi
exit $fail
