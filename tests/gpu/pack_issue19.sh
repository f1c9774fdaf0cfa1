#!/usr/bin/env bash
# Build machine: builds what tests/gpu/run_issue19.sh runs and packs it into .devpack/ (bazel-bin
# read through its link: `bazel info` would wait for the shared server lock).
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(//daemon:kvraild //examples:kv_demo //tests/gpu:flags_gpu_test //tests/gpu:layout_bench
         //tests/gpu:issue19_daemon_bench //tests/gpu:kv_copy_gpu_test //tests/gpu:cuda_engine_gpu_test)
bazel build "${targets[@]}"
bin=bazel-bin  # (bazel info waits for the shared server lock)
paths=()
for t in "${targets[@]}"; do paths+=("$bin/$(echo "${t#//}" | tr ':' '/')"); done
"${DEVPACK:-../shared/tools/devpack}" "${paths[@]}"
du -sh .devpack
