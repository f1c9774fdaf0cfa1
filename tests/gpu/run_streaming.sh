#!/usr/bin/env bash
# Runs the streaming/priority benchmark on a GPU machine from .devpack/ (built here, packed with
# ../shared/tools/devpack daemon/kvraild tests/gpu/streaming_bench). Starts the CUDA MPS control
# daemon for the run when available (kvraild's kernels beside another process's, as deployed),
# and stops it before returning.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
export LD_LIBRARY_PATH=$PWD/.devpack/lib:${LD_LIBRARY_PATH:-}
rf=$(mktemp -d /tmp/rf.XXXXXX)
mkdir -p "$rf/kvrail/daemon"
ln -s "$PWD/.devpack/bin/kvraild" "$rf/kvrail/daemon/kvraild"
export TEST_SRCDIR=$rf TEST_WORKSPACE=kvrail
nvidia-smi -L; date -u
echo "== without MPS (kvraild and the bench time-slice the GPU)"
timeout 200 .devpack/bin/streaming_bench 2>&1 | tee "$out/streaming.txt"
echo "exit ${PIPESTATUS[0]}"
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/mps-pipe.XXXXXX)
  export CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/mps-log.XXXXXX)
  nvidia-cuda-mps-control -d
  echo "== with MPS (as deployed: kvraild beside the inference server)"
  timeout 200 .devpack/bin/streaming_bench 2>&1 | tee "$out/streaming_mps.txt"
  echo "exit ${PIPESTATUS[0]}"
  echo quit | nvidia-cuda-mps-control
fi
