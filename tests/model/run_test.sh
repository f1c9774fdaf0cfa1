#!/usr/bin/env bash
# Bazel's wrapper for the model handover test: the PyPI venv's python ($KVRAIL_VENV, made by
# deploy/pyvenv.sh) runs pytest with the runfiles' kvrail package, libkvrail.so and kvraild.
# Without the venv the test fails, naming what is missing.
set -eu
root="${TEST_SRCDIR:?run me with bazel test //tests/model:model_handover_test}"
root="$root/${TEST_WORKSPACE:-kvrail}"
venv=${KVRAIL_VENV:-}
if [ -z "$venv" ] || [ ! -x "$venv/bin/python" ]; then
  echo "FAIL: KVRAIL_VENV='$venv' is not a venv with bin/python; make it with deploy/pyvenv.sh" \
    "and run KVRAIL_VENV=\$(deploy/pyvenv.sh) bazel test //tests/model:model_handover_test" >&2
  exit 1
fi
if ! "$venv/bin/python" -c 'import torch, transformers, numpy, pytest' 2>/dev/null; then
  echo "FAIL: $venv lacks torch, transformers, numpy or pytest (python/requirements-ci.txt;" \
    "deploy/pyvenv.sh installs them)" >&2
  exit 1
fi
export KVRAIL_LIB="$root/client/c_api/libkvrail.so"
export KVRAIL_DAEMON="$root/daemon/kvraild"
export PYTHONPATH="$root/python:$root/tests/model:$root/tests/gpu"
export PYTHONDONTWRITEBYTECODE=1
unset KVRAIL_SOCKET
cd "${TEST_TMPDIR:-/tmp}"
exec "$venv/bin/python" -m pytest -q -s -p no:cacheprovider --rootdir="$root/tests/model" \
  "$root/tests/model/model_handover_test.py" "$@"
