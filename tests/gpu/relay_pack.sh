#!/usr/bin/env bash
# Build machine: builds what tests/gpu/relay_run.sh runs (issue 18 item 3, the hierarchical
# path's relay hop) and packs it into .devpack_hr/ (../../briefs/devpack_to; PACK=.devpack_<x> to
# pack elsewhere).
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(//daemon:kvraild //tests/gpu:relay_gpu_test //tests/gpu:fabric_kernel_bench)
bazel build "${targets[@]}"
paths=()
for t in "${targets[@]}"; do paths+=("bazel-bin/$(echo "${t#//}" | tr ':' '/')"); done
"${DEVPACK_TO:-/work/briefs/devpack_to}" "${PACK:-.devpack_hr}" "${paths[@]}"
