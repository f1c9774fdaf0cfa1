#!/usr/bin/env bash
# Issue 19 on one GPU, from .devpack/ (packed by tests/gpu/pack_issue19.sh). PARTS picks what
# runs (default "flags layouts daemon engine"):
#   flags    the consumer-side flag test: once without the kernel preloaded (KVRAIL_FLAGS_NO_PRELOAD,
#            to show the hang's cause; the watchdog makes it fail in ~20 s instead of hanging),
#            then FLAG_RUNS processes x FLAG_ROUNDS handovers without MPS and again under MPS;
#   layouts  tests/gpu/layout_bench (named layouts, kernel only, vs the aligned layout);
#   daemon   tests/gpu/issue19_daemon_bench (first transfer vs warm; copy-engine-only mode);
#   engine   kv_copy_gpu_test and cuda_engine_gpu_test (byte-for-byte, the new kernel path).
# Logs go to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
parts=${PARTS:-flags layouts daemon engine}
nvidia-smi -L; date -u

flag_loop() {  # $1: label
  local pass=0 fail=0 i
  for i in $(seq "${FLAG_RUNS:-20}"); do
    if KVRAIL_FLAGS_ROUNDS=${FLAG_ROUNDS:-5} run_group timeout 90 .devpack/bin/flags_gpu_test \
        > "$out/flags_$1_$i.txt" 2>&1; then
      pass=$((pass + 1)); rm -f "$out/flags_$1_$i.txt"
    else
      fail=$((fail + 1)); echo "run $i failed:"; tail -20 "$out/flags_$1_$i.txt"
    fi
  done
  echo "flags $1: $pass passed, $fail failed (runs of ${FLAG_ROUNDS:-5} handovers each)"
}

if [[ $parts == *flags* ]]; then
  echo "== flags: the old order (producer kernel not loaded before the waits), no MPS"
  t0=$SECONDS
  KVRAIL_FLAGS_NO_PRELOAD=1 KVRAIL_FLAGS_ROUNDS=1 run_group timeout 90 .devpack/bin/flags_gpu_test \
      > "$out/flags_nopreload.txt" 2>&1
  echo "exit $? after $((SECONDS - t0)) s"; tail -8 "$out/flags_nopreload.txt"
  echo "== flags: the same with CUDA_MODULE_LOADING=EAGER"
  CUDA_MODULE_LOADING=EAGER KVRAIL_FLAGS_NO_PRELOAD=1 KVRAIL_FLAGS_ROUNDS=1 run_group timeout 90 \
      .devpack/bin/flags_gpu_test > "$out/flags_eager.txt" 2>&1
  echo "exit $?"; tail -3 "$out/flags_eager.txt"
  echo "== flags: fixed test, no MPS"
  flag_loop nomps
  if start_mps; then
    echo "== flags: fixed test, MPS"
    flag_loop mps
    stop_mps
  fi
fi
if [[ $parts == *layouts* ]]; then
  echo "== layouts (kernel only)"
  run_group timeout 300 .devpack/bin/layout_bench ${LAYOUT_ARGS:-} > "$out/layouts.txt" 2>&1
  echo "exit $?"; cat "$out/layouts.txt"
fi
if [[ $parts == *daemon* ]]; then
  echo "== issue19_daemon_bench"
  run_group timeout 300 .devpack/bin/issue19_daemon_bench ${DAEMON_PART:-all} > "$out/daemon_bench.txt" 2>&1
  echo "exit $?"; cat "$out/daemon_bench.txt"
fi
if [[ $parts == *engine* ]]; then
  echo "== kv_copy_gpu_test"
  run_group timeout 200 .devpack/bin/kv_copy_gpu_test > "$out/kernel_test.txt" 2>&1
  echo "exit $?"; tail -4 "$out/kernel_test.txt"
  echo "== cuda_engine_gpu_test"
  run_group timeout 200 .devpack/bin/cuda_engine_gpu_test > "$out/engine_test.txt" 2>&1
  echo "exit $?"; tail -4 "$out/engine_test.txt"
fi
