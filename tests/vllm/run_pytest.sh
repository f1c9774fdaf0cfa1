#!/usr/bin/env bash
# Bazel's wrapper for the vLLM connector tests and benchmark: the PyPI venv's interpreter
# ($KVRAIL_VENV, made by deploy/pyvenv.sh: vllm, torch) over the runfiles' kvrail package,
# libkvrail.so and kvraild. No venv (or one without vllm) is a failure, never a skip.
#   run_pytest.sh FILE [ARGS...]   pytest on tests/vllm/FILE
#   run_pytest.sh --script FILE [ARGS...]   the venv's python on tests/vllm/FILE
# Every step that can fail is checked where it runs; the last one execs the test.
set -uo pipefail
root="${TEST_SRCDIR:?run me with bazel test //tests/vllm:...}/${TEST_WORKSPACE:-kvrail}"
if [[ -z "${KVRAIL_VENV:-}" || ! -x "${KVRAIL_VENV}/bin/python" ]]; then
  echo "KVRAIL_VENV is not set or has no bin/python: run deploy/pyvenv.sh and export" \
       "KVRAIL_VENV=\$(deploy/pyvenv.sh) (deploy/dev.sh test does)" >&2
  exit 1
fi
if ! "$KVRAIL_VENV/bin/python" -c 'import vllm, torch' 2>/dev/null; then
  echo "$KVRAIL_VENV has no vllm or torch: run deploy/pyvenv.sh (python/requirements-ci.txt)" >&2
  exit 1
fi
export KVRAIL_LIB="$root/client/c_api/libkvrail.so"
export KVRAIL_DAEMON="$root/daemon/kvraild"
export PYTHONPATH="$root/python:$root/tests/vllm"
export PYTHONDONTWRITEBYTECODE=1
# vLLM and Hugging Face: offline, caches in the test's temporary folder.
tmp="${TEST_TMPDIR:-$(mktemp -d)}" || exit 1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export HF_HOME="$tmp/hf" VLLM_CACHE_ROOT="$tmp/vllm" XDG_CACHE_HOME="$tmp/cache"
unset KVRAIL_SOCKET
cd "$tmp" || exit 1
if [[ "${1:-}" == "--script" ]]; then
  shift
  file="$1"
  shift
  exec "$KVRAIL_VENV/bin/python" "$root/tests/vllm/$file" "$@"
fi
file="$1"
shift
exec "$KVRAIL_VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$root/tests/vllm" \
  "$root/tests/vllm/$file" "$@"
