#!/usr/bin/env bash
# Creates (or brings up to date) the Python venv that the PyPI-dependent tests and benchmarks use:
# the real vllm, torch, transformers, nixl and Mooncake packages, pinned in
# python/requirements-ci.txt. Prints the venv's folder on stdout. Idempotent: a venv whose recorded
# requirements hash matches is reused as it is (a second run takes a second).
#   KVRAIL_VENV   the folder (default ~/.cache/kvrail/venv)
# Uses Debian's /usr/bin/python3 (3.11) with python3-venv, so the venv does not depend on whichever
# python3 is first on PATH. pip's download cache stays under ~/.cache/pip.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KVRAIL_VENV:-$HOME/.cache/kvrail/venv}
req=python/requirements-ci.txt
want=$(sha256sum "$req" | cut -d' ' -f1)
log() { printf '[pyvenv] %s\n' "$*" >&2; }
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.kvrail-req" 2>/dev/null)" = "$want" ]; then
  echo "$venv"
  exit 0
fi
if ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing python3-venv"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
start=$SECONDS
# A venv made earlier is brought up to date in place (pip adds or changes what the list asks for).
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
fi
log "installing $req into $venv (PyPI; several GiB the first time)"
"$venv/bin/python" -m pip install -q --progress-bar off -r "$req" >&2
echo "$want" >"$venv/.kvrail-req"
log "venv ready in $((SECONDS - start)) s"
echo "$venv"
