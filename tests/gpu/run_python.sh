#!/usr/bin/env bash
# Issue 16's GPU runs, on the GPU machine, from .devpack/ (tests/gpu/pack.sh builds and packs
# kvraild, libkvrail.so, submit_latency_bench and the Python package with its generated protos
# into .devpack/py): per-layer CUDA regions (correctness and one transfer vs per-layer
# transfers), the Python overhead benchmark beside the C++ client, and the model handover test
# (prefill and decode processes on GPU0, tokens compared with one process). Every process it
# starts is ended by pid or process group (gpu_env.sh).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L; date -u
PY=${PY:-/opt/torch/.venv/bin/python3}
[[ -x $PY ]] || PY=python3
export PYTHONPATH=$PWD/.devpack/py:$PWD/tests/gpu PYTHONUNBUFFERED=1
export KVRAIL_LIB=$PWD/.devpack/bin/libkvrail.so
"$PY" -c "import kvrail, torch; print('kvrail from', kvrail.__file__, 'torch', torch.__version__)"
rc=0
parts=" ${PY_PARTS:-regions cumem overhead copy-engines model} "
has() { [[ $parts == *" $1 "* ]]; }

work=$(mktemp -d /tmp/kvpy.XXXXXX)
sock=$work/k.sock
.devpack/bin/kvraild --socket "$sock" --log-level info > "$work/kvraild.log" 2>&1 &
daemon=$!
track "$daemon"
for _ in $(seq 100); do grep -q "ready: " "$work/kvraild.log" 2>/dev/null && break; sleep 0.1; done

if has regions; then
echo "== per-layer CUDA regions"
run_group timeout 240 "$PY" tests/gpu/per_layer_gpu.py --socket "$sock" || { echo "per_layer_gpu exit $?"; rc=1; }
fi
if has cumem; then
echo "== cuMem (expandable_segments) regions"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run_group timeout 240 "$PY" tests/gpu/cumem_gpu.py \
  --socket "$sock" || { echo "cumem_gpu exit $?"; rc=1; }
fi
if has overhead; then
echo "== Python overhead (16 MiB GPU0 -> GPU0, Python beside the C++ client)"
run_group timeout 240 "$PY" tests/gpu/python_overhead.py --socket "$sock" \
  --cxx-bench .devpack/bin/submit_latency_bench || { echo "python_overhead exit $?"; rc=1; }
fi
kill -TERM "$daemon"; wait "$daemon"; echo "kvraild exit $?"; untrack "$daemon"
cp "$work/kvraild.log" "$out/kvraild_python.log" 2>/dev/null

if has copy-engines; then
echo "== per-layer CUDA regions, copy engines only (cuda_max_ctas: 0)"
echo "cuda_max_ctas: 0" > "$work/ce.textproto"
.devpack/bin/kvraild --socket "$work/ce.sock" --config "$work/ce.textproto" --log-level info \
  > "$work/kvraild_ce.log" 2>&1 &
daemon=$!
track "$daemon"
for _ in $(seq 100); do grep -q "ready: " "$work/kvraild_ce.log" 2>/dev/null && break; sleep 0.1; done
run_group timeout 120 "$PY" tests/gpu/per_layer_gpu.py --socket "$work/ce.sock" --correctness-only \
  || { echo "per_layer_gpu (copy engines) exit $?"; rc=1; }
kill -TERM "$daemon"; wait "$daemon"; echo "kvraild exit $?"; untrack "$daemon"
fi

if has model; then
echo "== model handover (prefill on GPU0, decode on GPU1 when two are visible)"
run_group timeout 400 "$PY" tests/gpu/model_handover.py driver --daemon .devpack/bin/kvraild \
  || { echo "model_handover exit $?"; rc=1; }
fi
exit $rc
