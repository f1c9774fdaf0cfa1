#!/usr/bin/env bash
# Bazel's wrapper for the torch cases of the Python suite: the same package, library and daemon as
# //python:python_test, run by the PyPI venv's interpreter ($KVRAIL_VENV, made by deploy/pyvenv.sh;
# it has torch). No venv is a failure, never a skip.
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test //python:torch_host_test}/${TEST_WORKSPACE:-kvrail}"
if [[ -z "${KVRAIL_VENV:-}" || ! -x "${KVRAIL_VENV}/bin/python" ]]; then
  echo "KVRAIL_VENV is not set or has no bin/python: run deploy/pyvenv.sh and export" \
       "KVRAIL_VENV=\$(deploy/pyvenv.sh) (deploy/dev.sh test does)" >&2
  exit 1
fi
export KVRAIL_LIB="$root/client/c_api/libkvrail.so"
export KVRAIL_DAEMON="$root/daemon/kvraild"
export PYTHONPATH="$root/python:$root/python/tests"
export PYTHONDONTWRITEBYTECODE=1
unset KVRAIL_SOCKET
cd "${TEST_TMPDIR:-/tmp}"
exec "$KVRAIL_VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$root/python" \
  -p conftest "$root/python/tests_torch" "$@"
