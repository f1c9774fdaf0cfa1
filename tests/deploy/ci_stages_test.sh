#!/bin/bash
# deploy/dev.sh's sanitizer stages against CI's time budget, with tiny budgets and stand-ins for
# bazel, the test runs and the fuzzers. Each stage runs its whole scope or is counted FAILED with
# its reason printed, never a smaller scope counted as a pass: a stage is refused up front only
# below its floor, a run as long as the last CI run's leaves every stage whole, a stage stopped at
# the hard stop is counted FAILED, every fuzzer runs at least its minimum seconds or the fuzz stage
# fails; KVRAIL_SAN=0, a scope that ran no test and a fuzzer that failed to build are failures;
# the run's last line counts the stages. Nothing here may pass by not running.
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

# Stand-ins: what the stages asked for goes to $tmp/calls; each test stage "takes" STAGE_TAKES s.
STAGE_TAKES=0
bazel() { echo "bazel $*" >> "$tmp/calls"; }
san_tests() {
  echo "san_tests $1 $4" >> "$tmp/calls"
  SAN_PASSED=$((SAN_PASSED + 1))
  SECONDS=$((SECONDS + STAGE_TAKES))
}
tsan_canary() { echo "tsan_canary" >> "$tmp/calls"; }
fuzz_tests() { echo "fuzz_tests $*" >> "$tmp/calls"; }
run_stages() {  # run_stages BUDGET [USED]: the stages with SECONDS at USED (0), output in $tmp/out
  : > "$tmp/calls"
  SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=$1 SECONDS=${2:-0}
  sanitizer_stages > "$tmp/out" 2>&1
}
# Every test stage that ran, ran its whole scope; the fuzzers got no smaller mode.
only_whole_scopes() {
  ! grep -q -v -x -e "san_tests asan $ASAN_SCOPE" -e "san_tests tsan $TSAN_SCOPE" -e tsan_canary \
    -e "fuzz_tests " -e "bazel .*shutdown" "$tmp/calls"
}
stages_run() {  # how many of asan, tsan (with its canary) and fuzz were started
  local n=0
  grep -qx "san_tests asan $ASAN_SCOPE" "$tmp/calls" && n=$((n + 1))
  grep -qx "san_tests tsan $TSAN_SCOPE" "$tmp/calls" && grep -qx tsan_canary "$tmp/calls" &&
    n=$((n + 1))
  grep -qx "fuzz_tests " "$tmp/calls" && n=$((n + 1))
  echo "$n"
}

# ASan covers the trust boundaries: the session socket and gRPC servers, the fabric, the
# directory, the C ABI (and the integration, load and fault tests beside the unit tests).
asan_scope_has() {
  local m
  for m in "$@"; do [[ " $ASAN_SCOPE " == *" $m "* ]] || return 1; done
}
check "asan's scope: the session and gRPC servers, fabric, directory, C ABI, integration" \
  asan_scope_has //daemon/session/... //daemon/server/... //daemon/fabric/... \
  //daemon/directory/... //client/c_api/... //tests/integration/... //tests/load:load_test \
  //tests/fault:fault_test //tests/fault:fault_peer_test

run_stages 100000
check "a budget that fits: asan whole" grep -qx "san_tests asan $ASAN_SCOPE" "$tmp/calls"
check "  tsan whole, and its canary" \
  bash -c "grep -qx 'san_tests tsan $TSAN_SCOPE' '$tmp/calls' && grep -qx tsan_canary '$tmp/calls'"
check "  the fuzzers" grep -qx "fuzz_tests " "$tmp/calls"
check "  nothing failed" test "$SAN_FAILED" -eq 0

# A healthy CI run with the default floors: the last CI run took 1,686 s in all; with the GCC
# stage at 1,400 s, 1,900 s are left of the 3,300 s budget (2,140 s before the hard stop): every
# stage runs whole (no estimate refuses it or shrinks it).
run_stages 3300 1400
check "a healthy run (1,400 s used of 3,300 s): asan whole" \
  grep -qx "san_tests asan $ASAN_SCOPE" "$tmp/calls"
check "  every stage started, nothing failed" \
  bash -c "[ $(stages_run) -eq 3 ] && [ $SAN_FAILED -eq 0 ]"
check "  no smaller scope" only_whole_scopes
check "  nothing REDUCED" bash -c "! grep -q REDUCED '$tmp/out'"
# Even with only 600 s left of the budget the stages are tried whole: the hard stop decides.
run_stages 3300 2700
check "600 s left: asan still tried whole, not refused" \
  bash -c "grep -qx 'san_tests asan $ASAN_SCOPE' '$tmp/calls' && [ $SAN_FAILED -eq 0 ]"

# Below a stage's floor it is refused: FAILED with the reason, no smaller scope in its place
# (the floor pinned here: 640 s left before the hard stop, asan takes at least 700 s).
KVRAIL_ASAN_FLOOR_S=700
export KVRAIL_ASAN_FLOOR_S
run_stages 3300 2900
unset KVRAIL_ASAN_FLOOR_S
check "asan's floor over what is left: no asan run of any scope" \
  bash -c "! grep -q 'san_tests asan' '$tmp/calls'"
check "  asan FAILED is printed with the time left" \
  grep -q "^asan stage FAILED (time budget: 640 s left before the hard stop at 3540 s; the whole stage takes at least 700 s" "$tmp/out"
check "  counted: asan and the fuzz stage that builds on it" test "$SAN_FAILED" -eq 2
check "  tsan, whose floor fits, runs whole" grep -qx "san_tests tsan $TSAN_SCOPE" "$tmp/calls"

# Over every budget (and long test stages): each stage runs whole or is counted FAILED; a run
# with no failure ran all three; never a smaller scope, never REDUCED.
sweep_bad=""
for takes in 0 700; do
  for budget in $(seq -300 60 3600); do
    STAGE_TAKES=$takes
    run_stages "$budget"
    n=$(stages_run)
    if ! only_whole_scopes || grep -q REDUCED "$tmp/out" ||
      [ $((n + SAN_FAILED)) -lt 3 ] || { [ "$SAN_FAILED" -eq 0 ] && [ "$n" -ne 3 ]; }; then
      sweep_bad="$sweep_bad $budget/$takes"
    fi
  done
done
STAGE_TAKES=0
check "every budget: whole or FAILED, never smaller (bad budget/stage s:${sweep_bad:- none})" \
  test -z "$sweep_bad"

run_stages 3300 3530
check "10 s before the hard stop: no test stage runs" bash -c "! grep -q san_tests '$tmp/calls'"
check "  each stage is FAILED, not skipped" test "$SAN_FAILED" -eq 3
check "  asan FAILED is printed" grep -q "^asan stage FAILED (time budget: 10 s left" "$tmp/out"
check "  the fuzz stage FAILED too" grep -q "^fuzz stage FAILED" "$tmp/out"
check "  no SKIPPED line" bash -c "! grep -q SKIPPED '$tmp/out'"

KVRAIL_SAN=0 run_stages 100000
check "KVRAIL_SAN=0: no stage runs" bash -c "! grep -q . '$tmp/calls'"
check "  SKIPPED is printed and counted as a failure" \
  bash -c "grep -q '^sanitizer stages SKIPPED (KVRAIL_SAN=0' '$tmp/out' && [ $SAN_FAILED -eq 1 ]"

# A test stage stopped at the hard stop (timeout's 124) is counted failed, with its time line.
unset -f san_tests
source <(sed -n '/^san_tests() {/,/^}/p' "$dir/deploy/dev.sh")
timeout() { echo "timeout $1" >> "$tmp/calls"; return 124; }
: > "$tmp/calls"
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=100 SECONDS=0
san_tests asan "$tmp/base" asan "//x/..." > "$tmp/out" 2>&1
check "a stage stopped at the hard stop is INCOMPLETE and counted FAILED" \
  bash -c "grep -q 'asan stage INCOMPLETE' '$tmp/out' && [ $SAN_FAILED -eq 1 ]"
check "  its time line is printed" grep -q "asan: 0 passed, 1 failed in [0-9]* s" "$tmp/out"
check "  the hard stop is the budget + 240 s" grep -qx "timeout 340" "$tmp/calls"
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=100 SECONDS=400
: > "$tmp/calls"
san_tests asan "$tmp/base" asan "//x/..." > "$tmp/out" 2>&1
check "  past the hard stop the limit is 1 s, never 0 (no limit)" grep -qx "timeout 1" "$tmp/calls"
unset -f timeout

# A scope that matched no test (bazel says nothing per test and exits 0) is counted failed.
timeout() { return 0; }
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=100 SECONDS=0
san_tests asan "$tmp/base" asan "//nothing/..." > "$tmp/out" 2>&1
check "a stage whose scope ran no test is FAILED" \
  bash -c "grep -q 'asan stage FAILED (no test ran' '$tmp/out' && [ $SAN_FAILED -eq 1 ] && [ $SAN_PASSED -eq 0 ]"
unset -f timeout

# The TSan canary's build stopped at the hard stop is FAILED.
unset -f tsan_canary
source <(sed -n '/^tsan_canary() {/,/^}/p' "$dir/deploy/dev.sh")
timeout() { return 124; }
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=100 SECONDS=0
tsan_canary > "$tmp/out" 2>&1
check "the tsan canary stopped at the hard stop is FAILED" \
  bash -c "grep -q '^tsan canary FAILED (exit 124)' '$tmp/out' && [ $SAN_FAILED -eq 1 ]"
unset -f timeout

# The fuzzers: with time, FUZZ_SECONDS each; short of time, fewer but at least FUZZ_MIN_SECONDS;
# when not even that fits before the hard stop, the stage is FAILED and none runs less.
unset -f fuzz_tests
source <(sed -n '/^fuzz_tests() {/,/^}/p' "$dir/deploy/dev.sh")
mkdir -p "$tmp/bin/tests/fuzz"
for f in one_fuzzer two_fuzzer; do
  printf '#!/bin/bash\necho "$0 $*" >> %s/runs\necho "stat::number_of_executed_units: 7"\n' \
    "$tmp" > "$tmp/bin/tests/fuzz/$f"
  chmod +x "$tmp/bin/tests/fuzz/$f"
done
BUILD_TAKES=0
bazel() {
  case "$*" in
    *" query "*) printf '//tests/fuzz:one_fuzzer\n//tests/fuzz:two_fuzzer\n' ;;
    *" info "*) echo "$tmp/bin" ;;
    *" build "*) SECONDS=$((SECONDS + BUILD_TAKES)) ;;
  esac
}
timeout() { shift; "$@"; }
FUZZ_FINDINGS="$tmp/findings"
fuzz_run() {  # fuzz_run BUDGET [USED]
  : > "$tmp/runs"
  SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=$1 SECONDS=${2:-0}
  fuzz_tests > "$tmp/out" 2>&1
  set +e  # (fuzz_tests turns errexit back on after each fuzzer, as dev.sh runs with it)
}
fuzz_run 100000
check "fuzzers with time: each runs FUZZ_SECONDS" \
  test "$(grep -c -- " -max_total_time=$FUZZ_SECONDS " "$tmp/runs")" -eq 2
# 40 s of budget left, 280 s before the hard stop: the budget's share is under the minimum, the
# hard stop's is not: each runs FUZZ_MIN_SECONDS.
fuzz_run 40
check "fuzzers short of budget: each runs FUZZ_MIN_SECONDS, not less" \
  test "$(grep -c -- " -max_total_time=$FUZZ_MIN_SECONDS " "$tmp/runs")" -eq 2
check "  no corpus replay in their place" bash -c "! grep -q -- '-runs=0' '$tmp/runs'"
check "  and count" test "$SAN_PASSED" -eq 2
# Too little left before the hard stop even up front: FAILED before the build, nothing runs.
fuzz_run 100 290
check "fuzzers that cannot get their minimum: FAILED, none runs" \
  bash -c "grep -q '^fuzz stage FAILED (time budget: 50 s left' '$tmp/out' && ! grep -q . '$tmp/runs' && [ $SAN_FAILED -eq 1 ] && [ $SAN_PASSED -eq 0 ]"
fuzz_run 100 300
check "  with not even the build's floor left: FAILED before the query, once" \
  bash -c "grep -q '^fuzz stage FAILED (time budget: 40 s left' '$tmp/out' && [ \$(grep -c FAILED '$tmp/out') -eq 1 ] && [ $SAN_FAILED -eq 1 ]"
# A build that leaves less than each fuzzer's minimum: FAILED after the build.
BUILD_TAKES=300
fuzz_run 100
BUILD_TAKES=0
check "a build that eats the minimum: FAILED, none runs" \
  bash -c "grep -q '^fuzz stage FAILED (time budget: [0-9]* s left before the hard stop after building' '$tmp/out' && ! grep -q . '$tmp/runs' && [ $SAN_FAILED -eq 1 ] && [ $SAN_PASSED -eq 0 ]"

# A fuzz build stopped at the hard stop is INCOMPLETE.
timeout() { return 124; }
fuzz_run 100000
check "a fuzz build stopped at the hard stop: INCOMPLETE, FAILED, none runs" \
  bash -c "grep -q '^fuzz stage INCOMPLETE' '$tmp/out' && ! grep -q . '$tmp/runs' && [ $SAN_FAILED -eq 1 ]"
timeout() { shift; "$@"; }

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
fuzz_run 100000
check "a fuzzer that failed to build is FAILED, not run from an old binary" \
  bash -c "grep -q '^fuzz one_fuzzer FAILED (did not build)' '$tmp/out' && ! grep -q one_fuzzer '$tmp/runs'"
check "  the one that built runs and counts" \
  bash -c "grep -q two_fuzzer '$tmp/runs' && [ $SAN_PASSED -eq 1 ] && [ $SAN_FAILED -eq 1 ]"
unset -f timeout

# The run's last line ("N passed, N failed", what .ci/run ends with) counts the sanitizer
# stages, also when their bazel calls fail under dev.sh's errexit (a server that died: `bazel
# shutdown` and `bazel info` fail): the stages go on, the run is not cut short.
source <(sed -n '/^run_tests() {/,/^}/p;/^sanitizer_stages() {/,/^}/p' "$dir/deploy/dev.sh")
ensure_packages() { :; }
tsa_build() { return 0; }
mkdir -p "$tmp/deploy"
printf '#!/bin/bash\necho /nonexistent-venv\n' > "$tmp/deploy/pyvenv.sh"
chmod +x "$tmp/deploy/pyvenv.sh"
BAZEL=(gcc_stage)
gcc_stage() { printf '//a:a_test  PASSED in 1s\n//b:b_test  PASSED in 1s\n'; }
san_tests() { SAN_PASSED=$((SAN_PASSED + 1)); }
tsan_canary() { SAN_PASSED=$((SAN_PASSED + 1)); }
bazel() {
  case "$*" in
    *" query "*) printf '//tests/fuzz:one_fuzzer\n//tests/fuzz:two_fuzzer\n' ;;
    *" build "*) return 0 ;;
    *) return 1 ;;  # info, shutdown
  esac
}
timeout() { shift; "$@"; }
SAN_PASSED=0 SAN_FAILED=0 CI_BUDGET_S=100000 SECONDS=0
(set -e; run_tests) > "$tmp/out" 2>&1
rc=$?
check "the last line counts the sanitizer stages (GCC 2, thread-safety 1, asan 1, tsan 1, canary 1; 2 fuzzers failed)" \
  bash -c "[ \"\$(tail -1 '$tmp/out')\" = '6 passed, 2 failed' ] && [ $rc -ne 0 ]"
unset -f timeout bazel

echo "$fails failed"
[ "$fails" -eq 0 ]
