#!/usr/bin/env bash
# Runs the CUDA engine's GPU test, the GPU demo and the benchmark on a GPU machine from .devpack/
# (built here, packed with ../shared/tools/devpack daemon/kvraild client/kv_demo
# tests/gpu/cuda_engine_gpu_test tests/gpu/cuda_engine_bench). Writes logs to ${OUT:-/tmp}.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
export LD_LIBRARY_PATH=$PWD/.devpack/lib:${LD_LIBRARY_PATH:-}
rf=$(mktemp -d /tmp/rf.XXXXXX)
mkdir -p "$rf/kvrail/daemon" "$rf/kvrail/client"
ln -s "$PWD/.devpack/bin/kvraild" "$rf/kvrail/daemon/kvraild"
ln -s "$PWD/.devpack/bin/kv_demo" "$rf/kvrail/client/kv_demo"
export TEST_SRCDIR=$rf TEST_WORKSPACE=kvrail
nvidia-smi -L; date -u

echo "== GPU test"
timeout 150 .devpack/bin/cuda_engine_gpu_test --durations yes > "$out/gpu_test.txt" 2>&1
echo "exit $?" >> "$out/gpu_test.txt"
tail -40 "$out/gpu_test.txt"

echo "== demo (what deploy/dev.sh demo does, from .devpack)"
d=$(mktemp -d /tmp/demo.XXXXXX)
.devpack/bin/kvraild --socket "$d/k.sock" --log-level info > "$out/demo_daemon.txt" 2>&1 &
dp=$!
for _ in $(seq 100); do [ -S "$d/k.sock" ] && break; sleep 0.1; done
.devpack/bin/kv_demo prefill --socket "$d/k.sock" --info "$d/p.json" --seed 42 --ignore-stdin &
pp=$!
.devpack/bin/kv_demo decode --socket "$d/k.sock" --info "$d/p.json" 2>&1 | tee "$out/demo.txt"
kill -TERM $pp; wait $pp
kill -TERM $dp; wait $dp; echo "kvraild exit $?"
grep -E "CUDA engine|ready|accepted" "$out/demo_daemon.txt" | cut -c1-400

echo "== bench"
timeout ${BENCH_TIMEOUT:-200} .devpack/bin/cuda_engine_bench ${BENCH_ARGS:-} > "$out/bench.txt" 2>&1
echo "exit $?" >> "$out/bench.txt"
cat "$out/bench.txt"
