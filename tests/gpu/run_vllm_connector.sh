#!/usr/bin/env bash
# On the GPU machine (carry .gpupack, the GPU pack of tests/gpu/pack.sh): the vLLM connector's CUDA
# worker path, tests/gpu/vllm_connector_gpu.py, against the pack's kvraild, with the working
# tree's kvrail package (the pack's generated protos). Ends only the daemon it started, by pid.
#   bash tests/gpu/run_vllm_connector.sh [--device N] [--runs N]
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-/opt/torch/.venv/bin/python3}
[[ -x $PY ]] || PY=python3
work=$(mktemp -d /tmp/kvvllm-gpu.XXXXXX)
if ! tar -xJf .gpupack/gpupack.tar.xz -C "$work"; then
  echo "no .gpupack/gpupack.tar.xz: run tests/gpu/pack.sh on the build machine" >&2
  exit 1
fi
cp python/kvrail/*.py "$work/py/kvrail/"
export LD_LIBRARY_PATH=$work/lib:${LD_LIBRARY_PATH:-}
export KVRAIL_LIB=$work/lib/libkvrail.so PYTHONPATH=$work/py PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0
nvidia-smi -L
"$work/bin/kvraild" --socket "$work/k.sock" --log-level info > "$work/kvraild.log" 2>&1 &
daemon=$!
for _ in $(seq 200); do grep -q "ready: " "$work/kvraild.log" 2>/dev/null && break; sleep 0.1; done
timeout 300 "$PY" tests/gpu/vllm_connector_gpu.py --socket "$work/k.sock" "$@"
rc=$?
kill -TERM "$daemon" 2>/dev/null
wait "$daemon"
echo "kvraild exit $? (0: clean); vllm_connector_gpu exit $rc"
grep -E "error|ERROR|FATAL" "$work/kvraild.log" | tail -5
exit $rc
