#!/usr/bin/env bash
# Build machine: builds what tests/gpu/run_issue19_g1.sh runs and packs it into .devpack_g1/
# (git-excluded; carry it).
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(//daemon:kvraild //examples:kv_demo //tests/gpu:cuda_engine_gpu_test
         //tests/gpu:issue19_g1_bench //tests/gpu:flag_wait_bench //tests/gpu:flags_gpu_test)
bazel build "${targets[@]}"
paths=()
for t in "${targets[@]}"; do paths+=("bazel-bin/$(echo "${t#//}" | tr ':' '/')"); done
/work/briefs/devpack_to .devpack_g1 "${paths[@]}"
