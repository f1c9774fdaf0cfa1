#!/usr/bin/env bash
# The fast path's CPU targets in one run (host engine, this machine): builds the benches, starts
# one kvraild (//python:python_test's, the same binary the C++ bench starts), runs
# completion_queue_bench.py with the C++ rows in the same run (--cxx) and admission_bench
# (a 2^20-block SUBMIT beside a small tenant), then prints each target with its figure (median and
# min-max of RUNS runs) and a verdict (tests/bench/fast_path_targets.py). The benches' own tables
# and the load average are printed too; OUT (a folder) keeps their outputs.
#   KVRAIL_VENV=... tests/bench/fast_path_targets.sh [RUNS (3)]
# NO_BUILD=1 uses what bazel-bin holds. Ends only the kvraild it started, by its pid.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-3}
[[ -n ${KVRAIL_VENV:-} && -x $KVRAIL_VENV/bin/python ]] ||
  { echo "fast_path_targets: KVRAIL_VENV must name the venv (deploy/pyvenv.sh)" >&2; exit 2; }
if [[ ${NO_BUILD:-0} != 1 ]]; then
  bazel build //python:python_test //tests/bench:completion_bench //tests/bench:admission_bench
fi
srcdir=bazel-bin/python/python_test.runfiles
rf=$srcdir/kvrail
out=${OUT:-$(mktemp -d /tmp/kvfast.XXXXXX)}
mkdir -p "$out"
run=$(mktemp -d /tmp/kvfd.XXXXXX)  # a short folder: unix socket paths are limited to 108 bytes
pid=
finish() {
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$run"
}
trap finish EXIT
"$rf/daemon/kvraild" --socket "$run/kvrail.sock" --log-level info > "$run/kvraild.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  grep -q "ready: " "$run/kvraild.log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$run/kvraild.log" >&2; exit 1; }
  sleep 0.05
done
grep -q "ready: " "$run/kvraild.log" || { echo "kvraild did not become ready" >&2; exit 1; }
echo "## completion_queue_bench.py ($runs runs, C++ rows in the same run)"
TEST_SRCDIR=$srcdir PYTHONPATH=$rf/python KVRAIL_LIB=$rf/client/c_api/libkvrail.so \
  "$KVRAIL_VENV/bin/python" tests/bench/completion_queue_bench.py "$run/kvrail.sock" "$runs" \
  --cxx=bazel-bin/tests/bench/completion_bench | tee "$out/completion_queue_bench.txt"
echo
echo "## admission_bench ($runs runs, a 2^20-block SUBMIT)"
bazel-bin/tests/bench/admission_bench "$runs" 1000 20 | tee "$out/admission_bench.txt"
echo
echo "## the fast path's CPU targets (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
python3 tests/bench/fast_path_targets.py "$out/completion_queue_bench.txt" \
  "$out/admission_bench.txt"
echo "outputs: $out"
