#!/usr/bin/env bash
# Bazel's wrapper for the NIXL plugin tests: NIXL's own Python API (the nixl-cu13 wheel in the PyPI
# venv, $KVRAIL_VENV) loads libplugin_KVRAIL.so from the runfiles through NIXL_PLUGIN_DIR; each
# test module starts kvraild from the runfiles and ends it by pid. First abi_check.py compares the
# wheel's binaries with nixl_abi.h.
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test //tests/nixl:nixl_plugin_test}"
root="$root/${TEST_WORKSPACE:-kvrail}"
venv="${KVRAIL_VENV:-}"
if [ -z "$venv" ] || [ ! -x "$venv/bin/python" ]; then
  echo "FAIL: KVRAIL_VENV ('$venv') is not a venv with bin/python; make it with deploy/pyvenv.sh" \
    "and run: KVRAIL_VENV=\$(deploy/pyvenv.sh) bazel test //tests/nixl:nixl_plugin_test" >&2
  exit 1
fi
if ! "$venv/bin/python" -c 'import nixl_cu13' 2>/dev/null; then
  echo "FAIL: $venv has no nixl_cu13 (python/requirements-ci.txt pins nixl-cu13);" \
    "run deploy/pyvenv.sh" >&2
  exit 1
fi
export KVRAIL_DAEMON="$root/daemon/kvraild"
export KVRAIL_CLI="$root/tools/kvrail/kvrail"
export NIXL_PLUGIN_DIR="$root/plugins/nixl"
export PYTHONPATH="$root/tests/nixl"
export PYTHONDONTWRITEBYTECODE=1
export TMPDIR="${TEST_TMPDIR:-/tmp}"
unset KVRAIL_SOCKET
cd "$TMPDIR"
# The wheel's plugin ABI is still the one nixl_abi.h declares (vtable order), and the plugin
# exports only its entry points.
KVRAIL_PLUGIN="$NIXL_PLUGIN_DIR/libplugin_KVRAIL.so" \
  "$venv/bin/python" "$root/tests/nixl/abi_check.py"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$root/tests/nixl" \
  "$root/tests/nixl/test_nixl_plugin.py" "$@"
