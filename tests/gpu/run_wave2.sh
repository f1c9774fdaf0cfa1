#!/usr/bin/env bash
# Device machine (one GPU is enough), .devpack carried (tests/gpu/pack.sh): the GPU suite's tests
# and the demo after this wave's engine changes (per-layer tables, cuMem imports), then issue 16's
# Python runs (tests/gpu/run_python.sh). Logs land in ${OUT:-/tmp}.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp}
PARTS="test demo" TEST_TIMEOUT=150 tests/gpu/run_cuda_engine.sh > "$OUT/run_engine.txt" 2>&1
echo "== engine tests and demo"
grep -E "test cases|assertions|All tests" "$OUT/gpu_test.txt" "$OUT/kernel_test.txt" 2>/dev/null
grep -E "kv_demo decode|verified" "$OUT/run_engine.txt" | cut -c1-220
tests/gpu/run_python.sh 2>&1 | tee "$OUT/run_python.txt"
