#!/usr/bin/env bash
# Runs the CUDA engine's GPU test, the GPU demo and the benchmark on a GPU machine from .devpack/
# (built here, packed with ../shared/tools/devpack daemon/kvraild examples/kv_demo
# tests/gpu/cuda_engine_gpu_test tests/gpu/cuda_engine_bench tests/gpu/fabric_gpu_bench). Writes
# logs to ${OUT:-/tmp}. PARTS picks what runs (default "test demo bench"; "fabric" the fabric GPU
# row; "interference" the GEMM table under MPS).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
parts=${PARTS:-test demo bench}
nvidia-smi -L; date -u

if [[ $parts == *test* ]]; then
  echo "== GPU test"
  run_group timeout ${TEST_TIMEOUT:-200} .devpack/bin/cuda_engine_gpu_test --durations yes > "$out/gpu_test.txt" 2>&1
  echo "exit $?" >> "$out/gpu_test.txt"
  tail -30 "$out/gpu_test.txt"
  echo "== kernel test (kernel == host twin, in-process) and the kernel-only copy variants"
  run_group timeout 120 .devpack/bin/kv_copy_gpu_test "~[bandwidth]" > "$out/kernel_test.txt" 2>&1
  echo "exit $?" >> "$out/kernel_test.txt"
  tail -4 "$out/kernel_test.txt"
  run_group timeout 120 .devpack/bin/copy_variants_bench > "$out/variants.txt" 2>&1
  echo "exit $?" >> "$out/variants.txt"
fi

if [[ $parts == *demo* ]]; then
  echo "== demo (what deploy/dev.sh demo does, from .devpack)"
  d=$(mktemp -d /tmp/demo.XXXXXX)
  .devpack/bin/kvraild --socket "$d/k.sock" --log-level info > "$out/demo_daemon.txt" 2>&1 &
  dp=$!
  track $dp
  for _ in $(seq 100); do [ -S "$d/k.sock" ] && break; sleep 0.1; done
  .devpack/bin/kv_demo prefill --socket "$d/k.sock" --info "$d/p.json" --seed 42 --ignore-stdin &
  pp=$!
  track $pp
  timeout 60 .devpack/bin/kv_demo decode --socket "$d/k.sock" --info "$d/p.json" 2>&1 | tee "$out/demo.txt"
  kill -TERM $pp; wait $pp; untrack $pp
  kill -TERM $dp; wait $dp; echo "kvraild exit $?"; untrack $dp
  grep -E "CUDA engine|ready|accepted" "$out/demo_daemon.txt" | cut -c1-300 | head -8
fi

if [[ $parts == *bench* ]]; then
  echo "== bench"
  run_group timeout ${BENCH_TIMEOUT:-300} .devpack/bin/cuda_engine_bench ${BENCH_ARGS:-} > "$out/bench.txt" 2>&1
  echo "exit $?" >> "$out/bench.txt"
  cat "$out/bench.txt"
fi

if [[ $parts == *fabric* ]]; then
  echo "== fabric GPU row (two daemons on loopback)"
  run_group timeout ${FABRIC_TIMEOUT:-120} .devpack/bin/fabric_gpu_bench ${FABRIC_ARGS:-} > "$out/fabric_gpu.txt" 2>&1
  echo "exit $?" >> "$out/fabric_gpu.txt"
  cat "$out/fabric_gpu.txt"
fi

if [[ $parts == *interference* ]]; then
  echo "== interference (under MPS)"
  start_mps
  run_group timeout ${INTERFERENCE_TIMEOUT:-200} .devpack/bin/cuda_engine_bench ${INTERFERENCE_ARGS:---interference} > "$out/interference.txt" 2>&1
  echo "exit $?" >> "$out/interference.txt"
  stop_mps
  cat "$out/interference.txt"
fi
