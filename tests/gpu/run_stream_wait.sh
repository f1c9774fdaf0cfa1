#!/usr/bin/env bash
# Issue 19.3 (G4) on one GPU, from .devpack_g4/ (bazel build //tests/gpu:stream_wait_gpu_test,
# then /work/briefs/devpack_to .devpack_g4 bazel-bin/tests/gpu/stream_wait_gpu_test): the CUDA
# engine's GPU-side readiness wait, byte for byte and the dying producer, then "[latency]"
# (producer end -> last layer reported, stream wait vs 20 us poller + Enqueue), without MPS and
# under MPS. Logs go to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
pack=$PWD/.devpack_g4
export LD_LIBRARY_PATH=$pack/lib:$LD_LIBRARY_PATH
nvidia-smi -L; date -u
echo "== stream_wait_gpu_test (no MPS)"
run_group timeout 60 "$pack/bin/stream_wait_gpu_test" --durations yes > "$out/stream_wait.txt" 2>&1
echo "exit $?"; grep -E "latency|passed|failed|FAILED|stream wait:" "$out/stream_wait.txt" | tail -20
if start_mps; then
  echo "== stream_wait_gpu_test (MPS)"
  run_group timeout 60 "$pack/bin/stream_wait_gpu_test" --durations yes > "$out/stream_wait_mps.txt" 2>&1
  echo "exit $?"; grep -E "latency|passed|failed|FAILED|stream wait:" "$out/stream_wait_mps.txt" | tail -20
  stop_mps
fi
