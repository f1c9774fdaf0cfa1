#!/usr/bin/env bash
# Device machine, from the repository root with .devpack carried (tests/gpu/pack.sh): everything
# the GPU issues need in one command, about 5 minutes on two H200s (~4 on one). Logs land in
# ${OUT:-/tmp}; each part has its own timeout so one stuck part cannot eat the others.
set -uo pipefail
cd "$(dirname "$0")/../.."
# The device machine returns only a handful of files from $OUT: logs go to a scratch folder and
# come back as one archive (logs.tgz) beside the summary.
final=${OUT:-/tmp}
out=$(mktemp -d /tmp/kvrail-gpu-logs.XXXXXX)
export OUT=$out
tests/gpu/run_topology.sh > "$out/run_topology.txt" 2>&1
# The planner's accept work on this machine's CPU (block tables copied and checked).
LD_LIBRARY_PATH=$PWD/.devpack/lib:${LD_LIBRARY_PATH:-} timeout 60 .devpack/bin/plan_bench \
  > "$out/plan_bench.txt" 2>&1
# ENGINE_PARTS and STREAMING=0 narrow a run to what changed (device time is scarce).
PARTS=${ENGINE_PARTS:-test demo bench fabric interference} TEST_TIMEOUT=150 BENCH_TIMEOUT=240 \
  FABRIC_TIMEOUT=100 INTERFERENCE_TIMEOUT=270 tests/gpu/run_cuda_engine.sh > "$out/run_engine.txt" 2>&1
if [[ ${STREAMING:-1} != 0 ]]; then
  STREAMING_TIMEOUT=120 tests/gpu/run_streaming.sh > "$out/run_streaming.txt" 2>&1
fi
echo "== summary"
tail -2 "$out/plan_bench.txt"
grep -E "NV[0-9]+|nvlink_p2p" "$out/run_topology.txt" | head -4
grep -E "test cases|assertions|All tests" "$out/gpu_test.txt" "$out/kernel_test.txt" "$out"/flags_test*.txt 2>/dev/null
grep -E "^\| (4|16) KiB \| (slab|warp)|contiguous" "$out/variants.txt" 2>/dev/null
grep -E "kv_demo decode" "$out/run_engine.txt" | cut -c1-200
grep -E "^\| [0-9]+ KiB|p50 .* us|GB/s, cuda" "$out/bench.txt" 2>/dev/null
grep -E "^\|" "$out/fabric_gpu.txt" 2>/dev/null
grep -E "^GEMM|^\| " "$out/interference.txt" 2>/dev/null
grep -E "target|streaming|critical" "$out/run_streaming.txt" | head -12
tar czf "$final/logs.tgz" -C "$out" .
