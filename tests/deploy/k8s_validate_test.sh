#!/bin/bash
# deploy/k8s rendered with kubectl's kustomize (the base, the rdma and metrics-tls overlays) and
# validated against the Kubernetes API schemas with kubernetes-validate (PyPI, pinned in
# python/requirements-ci.txt; it ships the schemas, so nothing is fetched), strict (unknown
# fields are errors), for the oldest and newest Kubernetes versions it knows here; then what the
# schemas cannot say (check_kustomize.py): the ServiceMonitor finds the Service, RDMA only in the
# overlay, the Pod Security label. A broken manifest must fail the validator (it really runs).
# kubectl is Debian's kubernetes-client or any kubectl on PATH; both it and KVRAIL_VENV are
# required (the test fails without them, it does not skip).
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
kubectl=$(command -v kubectl || true)
[ -n "$kubectl" ] || { echo "FAIL kubectl not found (apt-get install kubernetes-client)"; exit 1; }
[ -n "${KVRAIL_VENV:-}" ] || { echo "FAIL KVRAIL_VENV is not set (deploy/pyvenv.sh)"; exit 1; }
validate="$KVRAIL_VENV/bin/kubernetes-validate"
[ -x "$validate" ] || { echo "FAIL $validate missing (deploy/pyvenv.sh installs it)"; exit 1; }
tmp=$(mktemp -d /tmp/kvrail-k8s.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# kustomize refuses files reached through links that leave the kustomization's folder: a copy.
cp -rL "$dir/deploy/k8s" "$tmp/k8s"
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
head -1 <<<"$("$kubectl" version --client 2>&1)"
for overlay in base rdma metrics-tls; do
  "$kubectl" kustomize "$tmp/k8s/$overlay" > "$tmp/$overlay.yaml" 2> "$tmp/$overlay.err" && rc=0 || rc=$?
  grep -v "deprecated" "$tmp/$overlay.err" || true
  check "kubectl kustomize deploy/k8s/$overlay renders" '[ $rc -eq 0 ] && [ -s "$tmp/$overlay.yaml" ]'
  for version in 1.29.0 1.37.0; do
    out=$("$validate" --strict -k "$version" "$tmp/$overlay.yaml" 2>&1) && rc=0 || rc=$?
    sed 's/^/     /' <<<"$out"
    check "deploy/k8s/$overlay valid against Kubernetes $version (strict)" \
      '[ $rc -eq 0 ] && [ "$(grep -c "passed for resource" <<<"$out")" -ge 4 ] && ! grep -q "^ERROR" <<<"$out"'
  done
done
# The metrics-tls overlay: kvraild's config asks for TLS and a token from the mounted Secret, and
# the ServiceMonitor scrapes https with the Secret's CA and token (the base stays plain http).
m="$tmp/metrics-tls.yaml"
check "metrics-tls: kvraild serves /metrics with TLS and a bearer token from the Secret" \
  'grep -q "cert_file: \"/etc/kvrail-metrics/tls.crt\"" "$m" && grep -q "metrics_bearer_token_file: \"/etc/kvrail-metrics/token\"" "$m" && grep -q "secretName: kvraild-metrics-tls" "$m" && grep -q "mountPath: /etc/kvrail-metrics" "$m"'
check "metrics-tls: the ServiceMonitor scrapes https with the CA and the token" \
  'grep -q "scheme: https" "$m" && grep -q "bearerTokenSecret:" "$m" && grep -q "key: ca.crt" "$m" && grep -q "key: token" "$m"'
check "base: the ServiceMonitor scrapes plain http" \
  'grep -q "scheme: http$" "$tmp/base.yaml" && ! grep -q "metrics_tls" "$tmp/base.yaml"'
# The validator catches a misspelt field (the check above can fail).
sed 's/readOnlyRootFilesystem:/readOnlyRootFilesytem:/' "$tmp/base.yaml" > "$tmp/broken.yaml"
"$validate" --strict "$tmp/broken.yaml" > "$tmp/broken.out" 2>&1 && rc=0 || rc=$?
check "a misspelt field fails validation" '[ $rc -ne 0 ] && grep -q "readOnlyRootFilesytem" "$tmp/broken.out"'
"$KVRAIL_VENV/bin/python" "$dir/tests/deploy/check_kustomize.py" "$tmp/base.yaml" "$tmp/rdma.yaml" || fail=1
# check_kustomize.py can fail: the rdma overlay read as the base asks for an RDMA resource.
"$KVRAIL_VENV/bin/python" "$dir/tests/deploy/check_kustomize.py" "$tmp/rdma.yaml" "$tmp/rdma.yaml" \
  > "$tmp/swapped.out" 2>&1 && rc=0 || rc=$?
check "check_kustomize.py refuses an RDMA resource in the base" \
  '[ $rc -eq 1 ] && grep -q "^FAIL base: no RDMA resource" "$tmp/swapped.out"'
exit $fail
