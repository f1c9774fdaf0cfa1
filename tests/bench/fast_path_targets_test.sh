#!/usr/bin/env bash
# fast_path_targets.py over recorded bench outputs (testdata/: one run on the build machine at
# load ~2.3; the admission floor's rows from a later run, the bench having gained them): each target's figure and verdict read from the right row, a missing row named as
# MISSING with a failing exit, the usage without arguments.
set -uo pipefail
dir=$(dirname "$0")
verdicts=$dir/fast_path_targets.py
cq=$dir/testdata/completion_queue_bench.txt
adm=$dir/testdata/admission_bench.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
check() {  # NAME COMMAND...
  if bash -c "$2"; then echo "ok: $1"; else echo "FAILED: $1"; failed=1; fi
}
export verdicts cq adm tmp
python3 "$verdicts" "$cq" "$adm" > "$tmp/out"
rc=$?
cat "$tmp/out"
check "every row present: exit 0" "[[ $rc == 0 ]]"
check "C++ p50 read from the C++ sq row and met" \
  'grep -qF "| 4 KiB submit -> completion seen, C++, p50 <= 15 us | 15.0 us (15.0-15.0) | met |" "$tmp/out"'
check "C++ p99 over 60 is missed" \
  'grep -qF "| 4 KiB submit -> completion seen, C++, p99 <= 60 us | 69.0 us (69.0-69.0) | missed |" "$tmp/out"'
check "the Python ratio is Python sq over C++ sq, same run" \
  'grep -qF "0.91x (Python 13.6 us (13.6-13.6) vs C++ 15.0 us) | met |" "$tmp/out"'
check "1,000 in flight from the sq lag row" \
  'grep -qF "seen <= 100 us after kvraild finished (p99) | 179.5 us (179.5-179.5) | missed |" "$tmp/out"'
check "batch status, Python and C++" \
  'grep -qF "(Python) | 0.5 ms (0.5-0.5) | met |" "$tmp/out" && grep -qF "(C++) | 0.1 ms (0.1-0.1) | met |" "$tmp/out"'
check "the admission ratio of the shipped default (a target) and without the bulk class (not one)" \
  'grep -qF "(the target: shipped default: 4 workers + 1 bulk (SCHED_IDLE, guarded)) | 2.07x (473.1 us beside it vs 228.3 unloaded) | missed |" "$tmp/out" &&
   grep -qF "(for comparison, not a target: 4 workers, no bulk class) | 6.35x (1480.7 us beside it vs 233.2 unloaded) | - |" "$tmp/out"'
check "the machine's floor row (the large tenant only copies its ids) is read, not a target" \
  'grep -qF "(the machine'"'"'s floor, not a target: floor: the large tenant only copies its ids, no kvraild work) | 4.32x (109.1 us beside it vs 25.3 unloaded) | - |" "$tmp/out"'
grep -v "^C++ sq" "$cq" > "$tmp/no_cxx.txt"
check "without the C++ rows: MISSING, exit 1" \
  '! python3 "$verdicts" "$tmp/no_cxx.txt" "$adm" > "$tmp/out2" && grep -q "not measured | MISSING" "$tmp/out2"'
check "without arguments: the usage, exit 2" \
  'python3 "$verdicts" 2> "$tmp/usage"; [[ $? == 2 ]] && grep -q "fast_path_targets.py COMPLETION" "$tmp/usage"'
exit $failed
