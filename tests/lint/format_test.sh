#!/bin/bash
# Every tracked C++ and CUDA source is in the repo's format (.clang-format: Google style, 100
# columns; tools/format/format.sh applies it). The check first shows it finds a misformatted file,
# then reads the checkout the runfiles link back to.
set -u
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
fail=0
command -v clang-format > /dev/null || { echo "FAIL clang-format is not installed"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$dir/.clang-format" "$tmp/.clang-format"
printf 'int  f( int x ){return x+1;}\n' > "$tmp/bad.cc"
printf 'int f(int x) { return x + 1; }\n' > "$tmp/good.cc"
if (cd "$tmp" && ! clang-format --dry-run --Werror bad.cc 2> /dev/null && clang-format --dry-run --Werror good.cc); then
  echo "ok   a misformatted file is found, a formatted one passes"
else
  echo "FAIL the format check does not tell bad.cc from good.cc"
  fail=1
fi
# The project itself (a git checkout; CI runs from one).
src=$(dirname "$(dirname "$(dirname "$(readlink -f "$dir/tests/lint/format_test.sh")")")")
if [ -e "$src/.git" ] && command -v git > /dev/null; then
  if "$src/tools/format/format.sh" --check > "$tmp/out"; then
    echo "ok   $(tail -1 "$tmp/out")"
  else
    cat "$tmp/out"
    echo "FAIL files above are not formatted: run tools/format/format.sh"
    fail=1
  fi
else
  echo "FAIL the source checkout is not reachable from the runfiles ($src): run from a git checkout"
  fail=1
fi
exit $fail
