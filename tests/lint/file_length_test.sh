#!/bin/bash
# Files split long before 1,000 lines: no tracked source file (*.cc *.h *.cu *.cuh *.py *.sh
# *.proto) is longer than 1,000 lines (file_length_lint.py; no allowlist). The lint first shows it
# finds a 1,001-line file in a made-up checkout (and passes 1,000 lines, untracked files and other
# suffixes), then reads the checkout the runfiles link back to.
set -uo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
lint="$dir/tests/lint/file_length_lint.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$dir/tests/lint/lint_test_lib.sh"
lines() { seq "$1" | sed 's/^/\/\/ /'; }

repo="$tmp/repo"
mkdir -p "$repo/a" "$repo/b"
lines 1001 > "$repo/a/long.cc"
lines 1000 > "$repo/a/limit.cc"
lines 1000 > "$repo/a/unterminated.py"
printf '# one more line, without a newline' >> "$repo/a/unterminated.py"
lines 1500 > "$repo/b/notes.txt"
lines 20 > "$repo/b/short.sh"
git -C "$repo" init -q && git -C "$repo" add a b && lines 3000 > "$repo/b/untracked.cc"
check "a tracked 1,001-line file is found, named with its length" \
  '! python3 "$lint" --root "$repo" > "$tmp/out" &&
   grep -qx "a/long.cc: 1001 lines (most allowed 1000): split it by responsibility" "$tmp/out" &&
   grep -q "^a/unterminated.py: 1001 lines" "$tmp/out" &&
   [ "$(grep -c " lines (most allowed" "$tmp/out")" = 2 ] || { cat "$tmp/out"; false; }'
check "1,000 lines, other suffixes and untracked files pass" \
  '! grep -q "limit.cc\|notes.txt\|short.sh\|untracked.cc" "$tmp/out" &&
   grep -qx "4 files read, 2 over 1000 lines" "$tmp/out" || { cat "$tmp/out"; false; }'
rm "$repo/a/long.cc" "$repo/a/unterminated.py"
check "a checkout without long files passes" \
  'python3 "$lint" --root "$repo" > "$tmp/out" || { cat "$tmp/out"; false; }'
check "a directory that is not a checkout is a usage error" \
  'python3 "$lint" --root "$tmp/nothing" > "$tmp/out" 2>&1; [ $? = 2 ] || { cat "$tmp/out"; false; }'

check_project "no tracked source file of the project is over 1,000 lines" "$lint"
exit $fail
