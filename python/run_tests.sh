#!/usr/bin/env bash
# Bazel's wrapper for the Python suite: points the package at the runfiles' libkvrail.so and
# kvraild, then runs Debian's pytest with the system interpreter.
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test //python:python_test}/${TEST_WORKSPACE:-kvrail}"
export KVRAIL_LIB="$root/client/c_api/libkvrail.so"
export KVRAIL_DAEMON="$root/daemon/kvraild"
export PYTHONPATH="$root/python"
export PYTHONDONTWRITEBYTECODE=1
unset KVRAIL_SOCKET
cd "${TEST_TMPDIR:-/tmp}"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider --rootdir="$root/python" "$root/python/tests" "$@"
