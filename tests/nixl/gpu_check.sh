#!/usr/bin/env bash
# The KVRAIL engine's VRAM path on the GPU machine (vram_engine_check.cc).
#   tests/nixl/gpu_check.sh pack   (build machine: builds and packs into .nixlpack/)
#   tests/nixl/gpu_check.sh run    (GPU machine, with .nixlpack carried: kvraild on a temporary
#                                   socket, the check, kvraild stopped by pid)
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  pack)
    bazel build //daemon:kvraild //tests/nixl:vram_engine_check
    bin=$(bazel info bazel-bin 2>/dev/null)
    "${DEVPACK:-../shared/tools/devpack}" -o .nixlpack "$bin/daemon/kvraild" \
      "$bin/tests/nixl/vram_engine_check"
    du -sh .nixlpack
    ;;
  run)
    export LD_LIBRARY_PATH=$PWD/.nixlpack/lib:${LD_LIBRARY_PATH:-}
    dir=$(mktemp -d /tmp/kvng.XXXXXX)
    .nixlpack/bin/kvraild --socket "$dir/kvrail.sock" --log-level info >"$dir/kvraild.log" 2>&1 &
    daemon=$!
    trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; tail -5 "$dir/kvraild.log"' EXIT
    for _ in $(seq 200); do
      grep -q "ready: " "$dir/kvraild.log" && break
      sleep 0.1
    done
    .nixlpack/bin/vram_engine_check "$dir/kvrail.sock"
    ;;
  *)
    sed -n 2,6p "$0"
    exit 2
    ;;
esac
