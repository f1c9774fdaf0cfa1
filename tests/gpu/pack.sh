#!/usr/bin/env bash
# Build machine: builds every program the GPU scripts run and packs them (with their shared
# libraries) into .devpack/ for the device machine (../shared/tools/devpack). Then run, there:
#   tests/gpu/run_all.sh          (carry .devpack)
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(//daemon:kvraild //tools/kvrail:kvrail //examples:kv_demo //topology:topo_probe
         //tests/gpu:cuda_engine_gpu_test //tests/gpu:cuda_engine_bench //tests/gpu:streaming_bench
         //tests/gpu:flags_gpu_test //tests/gpu:fabric_gpu_bench //tests/gpu:kv_copy_gpu_test
         //tests/gpu:copy_variants_bench //tests/bench:plan_bench //tests/netns:fabric_bench
         //tests/gpu:submit_latency_bench //client/c_api:libkvrail.so //python:protos)
bazel build "${targets[@]}"
bin=$(bazel info bazel-bin 2>/dev/null)
paths=()
for t in "${targets[@]}"; do
  [[ $t == //python:protos ]] && continue
  paths+=("$bin/$(echo "${t#//}" | tr ':' '/')")
done
rm -rf .devpack
# fi_pingpong (libfabric-bin): issue 5's peer benchmark, run by fabric_bench on the GPU machine's
# quieter, larger CPU (tests/gpu/run_fabric_host.sh).
"${DEVPACK:-../shared/tools/devpack}" "${paths[@]}" /usr/bin/fi_pingpong
# The pure-Python package with its generated protos (tests/gpu/run_python.sh puts it on PYTHONPATH).
mkdir -p .devpack/py
cp -r python/kvrail .devpack/py/
cp "$bin"/python/kvrail/proto/*_pb2.py .devpack/py/kvrail/proto/
find .devpack/py -name __pycache__ -prune -exec rm -rf {} +
du -sh .devpack
