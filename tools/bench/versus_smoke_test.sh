#!/usr/bin/env bash
# CI's guard for tools/bench/versus.py: scenarios A and B at one small row per system (4 MiB of
# 32 KiB pieces, one timed request), every destination checked byte for byte; no timing is
# asserted. Needs the PyPI venv ($KVRAIL_VENV, made by deploy/pyvenv.sh) and root (scenario B's
# network namespaces): without either it FAILS saying so.
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test //tools/bench:versus_smoke_test}/${TEST_WORKSPACE:-kvrail}"
if [ -z "${KVRAIL_VENV:-}" ] || [ ! -x "${KVRAIL_VENV}/bin/python" ]; then
  echo "FAIL: \$KVRAIL_VENV must name the PyPI venv (deploy/pyvenv.sh prints it; dev.sh test" \
    "exports it): got '${KVRAIL_VENV:-}'" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "FAIL: scenario B makes network namespaces and needs root" >&2
  exit 1
fi
for module in mooncake.engine nixl_cu13; do
  "$KVRAIL_VENV/bin/python" -c "import $module" || {
    echo "FAIL: $module does not import from $KVRAIL_VENV (run deploy/pyvenv.sh)" >&2
    exit 1
  }
done
export PYTHONDONTWRITEBYTECODE=1
cd "${TEST_TMPDIR:-/tmp}"
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$PWD}/versus_smoke.json"
"$KVRAIL_VENV/bin/python" "$root/tools/bench/versus.py" --smoke --scenario AB \
  --python "$KVRAIL_VENV/bin/python" --kvraild "$root/daemon/kvraild" \
  --kvrail-lib "$root/client/c_api/libkvrail.so" --kvrail-python "$root/python" --json "$out"
# Every system of both scenarios has its verified row (versus.py exits 1 on any failed row).
"$KVRAIL_VENV/bin/python" - "$out" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
want = {("A", "kvrail"), ("A", "mooncake"), ("A", "nixl"), ("B", "kvrail"), ("B", "mooncake"),
        ("B", "nixl")}
have = {(r["scenario"], r["system"]) for r in rows if r["verified"]}
missing = want - have
if missing:
    sys.exit(f"FAIL: no verified row for {sorted(missing)}")
print(f"versus smoke: {len(rows)} rows verified")
PY
