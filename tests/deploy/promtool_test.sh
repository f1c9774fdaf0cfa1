#!/bin/bash
# Prometheus's own checker on what operators load into Prometheus: `promtool check
# rules` on deploy/monitoring/kvrail-alerts.yaml and `promtool check metrics` (the exposition
# format and naming lint) on a live kvraild's /metrics, scraped after a refused submit and a
# transfer so counters and histograms have samples. promtool is Debian's prometheus package
# (deploy/dev.sh's PACKAGES); without it the test fails (it does not skip).
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
promtool=$(command -v promtool || true)
if [ -z "$promtool" ]; then
  echo "FAIL promtool not installed (apt-get install prometheus; deploy/dev.sh installs it)"
  exit 1
fi
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
head -1 <<<"$("$promtool" --version 2>&1)"

out=$("$promtool" check rules "$dir/deploy/monitoring/kvrail-alerts.yaml" 2>&1) && rc=0 || rc=$?
echo "$out" | sed 's/^/     /'
check "promtool check rules deploy/monitoring/kvrail-alerts.yaml" '[ $rc -eq 0 ] && grep -q "SUCCESS: [1-9][0-9]* rules found" <<<"$out"'

# The alert rules' own unit tests (promtool test rules): which nodes each rule fires for.
out=$(cd "$dir/tests/deploy" && "$promtool" test rules kvrail_alerts_test.yaml 2>&1) && rc=0 || rc=$?
echo "$out" | sed 's/^/     /'
check "promtool test rules tests/deploy/kvrail_alerts_test.yaml" '[ $rc -eq 0 ] && grep -q "SUCCESS" <<<"$out"'

# A host-engine kvraild on a temporary socket, metrics on port 0; stopped by its pid.
tmp=$(mktemp -d /tmp/kvrail-promtool.XXXXXX)
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
# The log exists before the loop below reads it (the background shell may open it later).
: >"$tmp/log"
"$dir/daemon/kvraild" --socket "$tmp/k.sock" --metrics-listen 127.0.0.1:0 --log-level info \
  2>"$tmp/log" &
pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's/.*metrics on 127\.0\.0\.1:0 (port \([0-9]*\)).*/\1/p;T;q' "$tmp/log")
  [ -n "$port" ] && [ -S "$tmp/k.sock" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "FAIL kvraild did not serve metrics:"; cat "$tmp/log"; exit 1; }
# A refused submit (an unknown region) so kvrail_submits_rejected_total has a sample.
"$dir/tools/kvrail/kvrail" --socket "$tmp/k.sock" submit --src-region 1 --src-blocks 0 \
  --dst-region 2 --dst-blocks 0 >/dev/null 2>&1 || true
python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(
  'http://127.0.0.1:%s/metrics' % sys.argv[1], timeout=10).read().decode())" "$port" > "$tmp/metrics"
check "the scrape has kvraild's families" 'grep -q "^kvrail_build_info{" "$tmp/metrics" && grep -q "^kvrail_submits_rejected_total{" "$tmp/metrics"'
check "the scrape has the GPU gauges the alert rules read" 'grep -q "^kvrail_gpus " "$tmp/metrics" && grep -q "^kvrail_cuda_gpus{mode=" "$tmp/metrics"'
lint=$("$promtool" check metrics < "$tmp/metrics" 2>&1) && rc=0 || rc=$?
[ -z "$lint" ] || echo "$lint" | sed 's/^/     promtool: /'
check "promtool check metrics on a live /metrics ($(grep -vc '^#' "$tmp/metrics") samples): no problems" '[ $rc -eq 0 ] && [ -z "$lint" ]'
exit $fail
