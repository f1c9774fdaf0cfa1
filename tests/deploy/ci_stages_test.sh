#!/bin/bash
# deploy/dev.sh's sanitizer stages against CI's time budget, with tiny budgets and stand-ins for
# bazel, the test runs and the fuzzers: a stage that does not fit runs its declared smaller
# scope ("REDUCED") or is counted FAILED, a stage stopped at the budget is counted FAILED, and the
# fuzzers short of time replay their corpus once; KVRAIL_SAN=0, a scope that ran no test and a
# fuzzer that failed to build are failures. Nothing here may pass by not running.
set -u
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export HOME="${HOME:-$tmp}"  # dev.sh names its output bases under it; bazel test sets none
fails=0
check() {  # check NAME CONDITION...
  local name=$1
  shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}

# shellcheck source=/dev/null
source "$dir/deploy/dev.sh"
set +e
cd "$tmp" || exit 1

# Stand-ins: what the stages asked for goes to $tmp/calls.
bazel() { echo "bazel $*" >> "$tmp/calls"; }
san_tests() { echo "san_tests $1 $4" >> "$tmp/calls"; SAN_PASSED=$((SAN_PASSED + 1)); }
tsan_canary() { echo "tsan_canary" >> "$tmp/calls"; }
fuzz_tests() { echo "fuzz_tests ${1:-full}" >> "$tmp/calls"; }
run_stages() {  # run_stages BUDGET: the stages with SECONDS at 0, output in $tmp/out
  : > "$tmp/calls"
  SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=$1 SECONDS=0
  sanitizer_stages > "$tmp/out" 2>&1
}

run_stages 100000
check "a budget that fits: every stage whole" \
  grep -qx "san_tests asan $ASAN_SCOPE" "$tmp/calls"
check "  tsan whole" grep -qx "san_tests tsan $TSAN_SCOPE" "$tmp/calls"
check "  the fuzzers for their time" grep -qx "fuzz_tests full" "$tmp/calls"
check "  nothing failed" test "$SAN_FAILED" -eq 0

# The estimates pinned for this case (the defaults change as CI is measured): the whole scope
# does not fit 700 s, its smaller scope does.
KVRAIL_ASAN_ESTIMATE_S=1000 KVRAIL_ASAN_SMALL_ESTIMATE_S=500
export KVRAIL_ASAN_ESTIMATE_S KVRAIL_ASAN_SMALL_ESTIMATE_S
run_stages 700
unset KVRAIL_ASAN_ESTIMATE_S KVRAIL_ASAN_SMALL_ESTIMATE_S
check "asan's whole scope does not fit: its smaller scope runs, said so" \
  grep -qx "san_tests asan $ASAN_SMALL_SCOPE" "$tmp/calls"
check "  REDUCED is printed" grep -q "^asan stage REDUCED (time budget: 700 s" "$tmp/out"
check "  the smaller scope has the trust boundaries" \
  bash -c "[[ '$ASAN_SMALL_SCOPE' == *//daemon/session/...* && '$ASAN_SMALL_SCOPE' == *//daemon/server/...* ]]"

run_stages 10
check "a tiny budget: no test stage runs" bash -c "! grep -q san_tests '$tmp/calls'"
check "  each stage is FAILED, not skipped" test "$SAN_FAILED" -eq 3
check "  asan FAILED is printed" grep -q "^asan stage FAILED (time budget: 10 s" "$tmp/out"
check "  the fuzz stage FAILED too" grep -q "^fuzz stage FAILED" "$tmp/out"
check "  no SKIPPED line" bash -c "! grep -q SKIPPED '$tmp/out'"

KVRAIL_SAN=0 run_stages 100000
check "KVRAIL_SAN=0: no stage runs" bash -c "! grep -q . '$tmp/calls'"
check "  SKIPPED is printed and counted as a failure" \
  bash -c "grep -q '^sanitizer stages SKIPPED (KVRAIL_SAN=0' '$tmp/out' && [ $SAN_FAILED -eq 1 ]"

# A test stage stopped at the budget (timeout's 124) is counted failed.
unset -f san_tests
source <(sed -n '/^san_tests() {/,/^}/p' "$dir/deploy/dev.sh")
timeout() { return 124; }
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=100 SECONDS=0
san_tests asan "$tmp/base" asan "//x/..." > "$tmp/out" 2>&1
check "a stage stopped at the budget is INCOMPLETE and counted FAILED" \
  bash -c "grep -q 'asan stage INCOMPLETE' '$tmp/out' && [ $SAN_FAILED -eq 1 ]"
unset -f timeout

# A scope that matched no test (bazel says nothing per test and exits 0) is counted failed.
timeout() { return 0; }
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=100 SECONDS=0
san_tests asan "$tmp/base" asan "//nothing/..." > "$tmp/out" 2>&1
check "a stage whose scope ran no test is FAILED" \
  bash -c "grep -q 'asan stage FAILED (no test ran' '$tmp/out' && [ $SAN_FAILED -eq 1 ] && [ $SAN_PASSED -eq 0 ]"
unset -f timeout

# The fuzzers with too little time left after their build replay their corpus once.
unset -f fuzz_tests
source <(sed -n '/^fuzz_tests() {/,/^}/p' "$dir/deploy/dev.sh")
mkdir -p "$tmp/bin/tests/fuzz"
for f in one_fuzzer two_fuzzer; do
  printf '#!/bin/bash\necho "$0 $*" >> %s/runs\necho "stat::number_of_executed_units: 7"\n' \
    "$tmp" > "$tmp/bin/tests/fuzz/$f"
  chmod +x "$tmp/bin/tests/fuzz/$f"
done
bazel() {
  case "$*" in
    *" query "*) printf '//tests/fuzz:one_fuzzer\n//tests/fuzz:two_fuzzer\n' ;;
    *" info "*) echo "$tmp/bin" ;;
  esac
}
timeout() { shift; "$@"; }
FUZZ_FINDINGS="$tmp/findings"
: > "$tmp/runs"
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=40 SECONDS=0
fuzz_tests full > "$tmp/out" 2>&1
check "fuzzers short of time: REDUCED to one corpus replay each" \
  grep -q "^fuzz stage REDUCED" "$tmp/out"
check "  each ran with -runs=0" test "$(grep -c -- ' -runs=0 ' "$tmp/runs")" -eq 2
check "  and counts" test "$SAN_PASSED" -eq 2
: > "$tmp/runs"
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=100000 SECONDS=0
fuzz_tests full > "$tmp/out" 2>&1
check "fuzzers with time: each runs FUZZ_SECONDS" \
  test "$(grep -c -- " -max_total_time=$FUZZ_SECONDS " "$tmp/runs")" -eq 2

# A fuzzer whose build failed is not run from the binary an earlier build left.
bazel() {
  case "$*" in
    *" query "*) printf '//tests/fuzz:one_fuzzer\n//tests/fuzz:two_fuzzer\n' ;;
    *" info "*) echo "$tmp/bin" ;;
    *"--check_up_to_date //tests/fuzz:one_fuzzer"*) return 1 ;;
    *"--check_up_to_date"*) return 0 ;;
    *" build "*) return 1 ;;
  esac
}
: > "$tmp/runs"
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=100000 SECONDS=0
fuzz_tests full > "$tmp/out" 2>&1
check "a fuzzer that failed to build is FAILED, not run from an old binary" \
  bash -c "grep -q '^fuzz one_fuzzer FAILED (did not build)' '$tmp/out' && ! grep -q one_fuzzer '$tmp/runs'"
check "  the one that built runs and counts" \
  bash -c "grep -q two_fuzzer '$tmp/runs' && [ $SAN_PASSED -eq 1 ] && [ $SAN_FAILED -eq 1 ]"

echo "$fails failed"
[ "$fails" -eq 0 ]
