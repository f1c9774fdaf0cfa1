#!/usr/bin/env bash
# CI (no build, no GPU): tests/gpu/pack_check.py finds the GPU pack's manifest complete and within
# its size budgets, and finds the gaps it exists to find in altered copies of the manifest (a
# gpu-tagged test dropped, a script dropped, a budget over the limit, an unknown target). The
# gpu-tagged targets outside tests/gpu and the tracked tree's size are read from the source tree
# the runfiles link back to (bazel test runs from a checkout); without it the test fails.
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE/tests/gpu"
manifest="$dir/pack_manifest.txt"
src=$(dirname "$(dirname "$(dirname "$(readlink -f "$manifest")")")")
# .git is a folder in a checkout, a file in a git worktree.
if [[ ! -e $src/.git || ! -f $src/WORKSPACE ]]; then
  echo "FAIL: the source tree is not reachable from the runfiles ($src)"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
run() { python3 "$dir/pack_check.py" --source-tree "$src" --scripts-dir "$dir" --manifest "$@"; }
ok() { if "${@:2}"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

if run "$manifest" > "$tmp/out"; then
  echo "ok   the manifest is complete and within budget: $(head -1 "$tmp/out")"
else
  echo "FAIL the manifest:"; cat "$tmp/out"; fail=1
fi

# Altered copies: each must be refused with the finding that names what is wrong.
expect() {  # NAME SED_SCRIPT FINDING_TEXT
  sed "$2" "$manifest" > "$tmp/m.txt"
  if run "$tmp/m.txt" > "$tmp/out"; then
    echo "FAIL $1: passed"; fail=1
  elif grep -qF -- "$3" "$tmp/out"; then
    echo "ok   $1"
  else
    echo "FAIL $1: no finding '$3'"; cat "$tmp/out"; fail=1
  fi
}
expect "a gpu-tagged test outside tests/gpu dropped" '/cuda_import_gpu_test/d' \
  "missing: //daemon/regions:cuda_import_gpu_test is tagged gpu"
expect "a tests/gpu benchmark dropped" '/:layout_bench /d' \
  "missing: //tests/gpu:layout_bench (cc_binary in tests/gpu/BUILD)"
expect "a script dropped" '/^script tests\/gpu\/gemm_load.py/d' \
  "missing: the script tests/gpu/gemm_load.py"
expect "a budget that breaks the unpacked limit" 's|^\(libs .*lib  *\)[0-9]*$|\1999999|' \
  "size: the budgets add up to"
expect "an archive limit that breaks the carry" 's|^limit  *archive .*|limit archive - 65000|' \
  "size: the archive limit 65000 KiB plus the tracked tree"
expect "an unknown target" '$a target //tests/gpu:no_such_bench bin/no_such_bench 10' \
  "unknown target: //tests/gpu:no_such_bench"
exit $fail
