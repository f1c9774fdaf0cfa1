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
  timeout 90 .devpack/bin/flags_gpu_test --durations yes 2>&1 | tee "$out/flags_test.txt" | tail -15
  kill_leftovers
fi
if [[ ${NO_MPS:-0} == 1 ]]; then
  echo "== without MPS (kvraild and the bench time-slice the GPU)"
  timeout 200 .devpack/bin/streaming_bench 2>&1 | tee "$out/streaming.txt"
  echo "exit ${PIPESTATUS[0]}"
  kill_leftovers
fi
if start_mps; then
  if [[ -x .devpack/bin/flags_gpu_test ]]; then
    echo "== consumer stream waits on arrival flags (MPS)"
    timeout 90 .devpack/bin/flags_gpu_test --durations yes 2>&1 | tee "$out/flags_test_mps.txt" | tail -15
    kill_leftovers
  fi
  echo "== with MPS (as deployed: kvraild beside the inference server)"
  timeout ${STREAMING_TIMEOUT:-200} .devpack/bin/streaming_bench 2>&1 | tee "$out/streaming_mps.txt"
  echo "exit ${PIPESTATUS[0]}"
  stop_mps
fi
