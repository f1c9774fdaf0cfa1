#!/bin/bash
# lintian on the Debian packages (//deploy:deb): kvrail and kvrail-dbgsym. Any error or warning
# fails the test (the package's own overrides, deploy/deb/lintian-overrides, say why each one
# left is right); info tags are printed, not counted. lintian is Debian's lintian package
# (deploy/dev.sh's PACKAGES): without it the test fails, it does not skip.
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
lintian=$(command -v lintian || true)
if [ -z "$lintian" ]; then
  echo "FAIL lintian is not installed (apt-get install lintian; deploy/dev.sh installs it)"
  exit 1
fi
head -1 <<<"$("$lintian" --version 2>&1)"
# The binaries of a fastbuild (Bazel's default, CI) are linked with -Wl,-S, so their .debug files
# hold symbols only; `-c opt` (deploy/container/build.sh, --config=release) keeps the -g1 line
# tables. That one tag is not a packaging defect.
suppress=debug-file-with-no-debug-symbols
out=$("$lintian" --tag-display-limit 0 --info --suppress-tags "$suppress" \
  "$dir/deploy/kvrail_amd64.deb" "$dir/deploy/kvrail-dbgsym_amd64.deb" 2>&1) && rc=0 || rc=$?
out=$(grep -v "running with root privileges" <<<"$out" || true)
[ -z "$out" ] || sed 's/^/     /' <<<"$out"
fail=0
if grep -q '^[EW]: ' <<<"$out"; then
  echo "FAIL lintian: $(grep -c '^[EW]: ' <<<"$out") errors or warnings"
  fail=1
elif [ "$rc" -ne 0 ]; then
  echo "FAIL lintian exited $rc"
  fail=1
else
  echo "ok   lintian: no errors or warnings on kvrail and kvrail-dbgsym"
fi
exit $fail
