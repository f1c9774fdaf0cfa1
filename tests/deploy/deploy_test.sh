#!/bin/bash
# Runs check_manifests.py with Debian's python3 (python3-yaml), and checks the default config
# is accepted by the daemon itself.
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
/usr/bin/python3 "$dir/tests/deploy/check_manifests.py"
# The documented default config parses and validates (the daemon exits 2 on a bad config file;
# here it must get as far as its socket: taking the socket's lock file, the first step there, fails
# on purpose: /nonexistent/...).
out=$("$dir/daemon/kvraild" --config "$dir/deploy/config/kvraild.textproto" \
      --socket /nonexistent/dir/k.sock 2>&1 || true)
echo "$out" | tail -2
grep -q "unix_socket: cannot open lock file /nonexistent/dir/k.sock.lock" <<<"$out" || {
  echo "FAIL: the default config did not get the daemon as far as binding its socket"; exit 1; }
echo "ok   config: kvraild accepts deploy/config/kvraild.textproto"
