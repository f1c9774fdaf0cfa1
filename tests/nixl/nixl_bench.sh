#!/usr/bin/env bash
# bazel run //tests/nixl:nixl_bench [-- bench_nixl.py options]: starts kvraild from the runfiles on
# a socket in a temporary folder, runs bench_nixl.py with the PyPI venv's Python ($KVRAIL_VENV),
# and stops kvraild by pid.
set -euo pipefail
here="$(cd "${RUNFILES_DIR:-$0.runfiles}/${TEST_WORKSPACE:-kvrail}" && pwd)"
venv="${KVRAIL_VENV:?set KVRAIL_VENV to the PyPI venv (deploy/pyvenv.sh prints it)}"
dir=$(mktemp -d /tmp/kvnb.XXXXXX)
"$here/daemon/kvraild" --socket "$dir/kvrail.sock" --log-level warning >"$dir/kvraild.log" 2>&1 &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do
  [ -S "$dir/kvrail.sock" ] && break
  sleep 0.05
done
cd "$dir"
export PYTHONPATH="$here/tests/nixl" KVRAIL_SOCKET="$dir/kvrail.sock"
export NIXL_PLUGIN_DIR="$here/plugins/nixl"
"$venv/bin/python" "$here/tests/nixl/bench_nixl.py" "$@"
