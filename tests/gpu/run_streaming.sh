#!/usr/bin/env bash
# Runs the streaming/priority benchmark on a GPU machine from .devpack/ (built here, packed with
# ../shared/tools/devpack daemon/kvraild tests/gpu/streaming_bench tests/gpu/flags_gpu_test) under
# the CUDA MPS control daemon (kvraild's kernels beside another process's, as deployed); NO_MPS=1
# adds a run without it first. The consumer-side flag test (flags_gpu_test) runs first, without
# and then with MPS, when it was packed. The MPS daemon is stopped before returning.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L; date -u
if [[ -x .devpack/bin/flags_gpu_test ]]; then
  echo "== consumer stream waits on arrival flags (no MPS)"
  run_group timeout 90 .devpack/bin/flags_gpu_test --durations yes > "$out/flags_test.txt" 2>&1
  tail -15 "$out/flags_test.txt"
fi
if [[ ${NO_MPS:-0} == 1 ]]; then
  echo "== without MPS (kvraild and the bench time-slice the GPU)"
  run_group timeout 200 .devpack/bin/streaming_bench > "$out/streaming.txt" 2>&1
  echo "exit $?"
  cat "$out/streaming.txt"
fi
if start_mps; then
  if [[ -x .devpack/bin/flags_gpu_test ]]; then
    echo "== consumer stream waits on arrival flags (MPS)"
    run_group timeout 90 .devpack/bin/flags_gpu_test --durations yes > "$out/flags_test_mps.txt" 2>&1
    tail -15 "$out/flags_test_mps.txt"
  fi
  echo "== with MPS (as deployed: kvraild beside the inference server)"
  run_group timeout ${STREAMING_TIMEOUT:-200} .devpack/bin/streaming_bench > "$out/streaming_mps.txt" 2>&1
  echo "exit $?"
  cat "$out/streaming_mps.txt"
  stop_mps
fi
