#!/usr/bin/env bash
# Build machine: builds what tests/gpu/run_fabric_kernel.sh runs (issue 19 item 4) and packs it
# into .devpack_g2/ (../../briefs/devpack_to; PACK=.devpack_<x> to pack elsewhere).
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(//daemon:kvraild //tests/gpu:fabric_kernel_gpu_test //tests/gpu:fabric_kernel_bench)
bazel build "${targets[@]}"
paths=()
for t in "${targets[@]}"; do paths+=("bazel-bin/$(echo "${t#//}" | tr ':' '/')"); done
"${DEVPACK_TO:-/work/briefs/devpack_to}" "${PACK:-.devpack_g2}" "${paths[@]}"
