#!/usr/bin/env bash
# Topology check on a GPU machine from .devpack/ (built here, packed with ../shared/tools/devpack
# daemon/kvraild client/kvrail topology/topo_probe): nvidia-smi's view beside kvrail's, through
# both the probe and a live daemon's `kvrail topo`. Writes the replayable dump to ${OUT:-/tmp}.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
export LD_LIBRARY_PATH=$PWD/.devpack/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date -u
echo "== nvidia-smi topo -m"; nvidia-smi topo -m
echo "== nvidia-smi nvlink -s (first GPU)"; nvidia-smi nvlink -s -i 0 | head -24
echo "== topo_probe --dump > $out/probed.textproto"
.devpack/bin/topo_probe --dump > "$out/probed.textproto"; echo "exit $?"
d=$(mktemp -d /tmp/topo.XXXXXX)
.devpack/bin/kvraild --socket "$d/k.sock" > "$out/topo_daemon.txt" 2>&1 &
dp=$!
# Ends the daemon this script started (by its pid) if the script stops early.
trap '[[ -n ${dp:-} ]] && kill -TERM "$dp" 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S "$d/k.sock" ] && break; sleep 0.1; done
echo "== kvrail topo (live daemon)"; .devpack/bin/kvrail --socket "$d/k.sock" topo
.devpack/bin/kvrail --socket "$d/k.sock" topo --json > "$out/topo.json"; echo "json exit $?"
kill -TERM $dp; wait $dp; echo "kvraild exit $?"; dp=""
