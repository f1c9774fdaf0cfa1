#!/bin/bash
# Debug lines build their arguments only when written: no tracked C++ source calls spdlog::debug
# or spdlog::trace directly (debug_log_lint.py; KVRAIL_DEBUG in base/logging.h instead). The lint
# first shows it finds such calls in a made-up checkout (and passes KVRAIL_DEBUG, comments,
# untracked files and the exempt logging files), then reads the checkout the runfiles link to.
set -uo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
lint="$dir/tests/lint/debug_log_lint.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$dir/tests/lint/lint_test_lib.sh"

repo="$tmp/repo"
mkdir -p "$repo/daemon" "$repo/base"
printf 'void A() {\n  spdlog::debug("plan {}", plan.Describe());\n}\n' > "$repo/daemon/a.cc"
printf 'void B() { spdlog::trace ("x {}", Join(v)); }\n' > "$repo/daemon/b.h"
printf 'void C() {\n  KVRAIL_DEBUG("plan {}", plan.Describe());\n  // spdlog::debug(...) builds it\n}\n' \
  > "$repo/daemon/c.cc"
printf '#define KVRAIL_DEBUG(...) spdlog::debug(__VA_ARGS__)\n' > "$repo/base/logging.h"
git -C "$repo" init -q && git -C "$repo" add daemon base
printf 'spdlog::debug("untracked");\n' > "$repo/daemon/untracked.cc"
check "direct debug and trace calls are found, named with their line" \
  '! python3 "$lint" --root "$repo" > "$tmp/out" &&
   grep -q "^daemon/a.cc:2: spdlog::debug(\"plan {}\", plan.Describe());" "$tmp/out" &&
   grep -q "^daemon/b.h:1: " "$tmp/out" &&
   grep -qx "3 files read, 2 debug or trace calls outside KVRAIL_DEBUG" "$tmp/out" ||
   { cat "$tmp/out"; false; }'
check "KVRAIL_DEBUG, comments, untracked files and base/logging.h pass" \
  '! grep -q "c.cc\|untracked\|logging.h" "$tmp/out" || { cat "$tmp/out"; false; }'
rm "$repo/daemon/a.cc" "$repo/daemon/b.h"
check "a checkout without such calls passes" \
  'python3 "$lint" --root "$repo" > "$tmp/out" || { cat "$tmp/out"; false; }'
check "a directory that is not a checkout is a usage error" \
  'python3 "$lint" --root "$tmp/nothing" > "$tmp/out" 2>&1; [ $? = 2 ] || { cat "$tmp/out"; false; }'

check_project "no tracked source of the project calls spdlog::debug or spdlog::trace directly" "$lint"
exit $fail
