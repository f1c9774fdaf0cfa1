#!/bin/bash
# Code reads as code: no tracker issue numbers, session or wave numbers or helper names in source
# files or in any tracked file's name (history_refs_lint.py says what counts). The lint finds each
# kind in a made-up file, passes the legitimate words beside them, and then finds nothing in the
# project outside testdata/history_refs_allowlist.txt.
set -uo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
lint="$dir/tests/lint/history_refs_lint.py"
allow="$dir/tests/lint/testdata/history_refs_allowlist.txt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

# The samples are .txt files (not read by the lint over the tree); copied as .cc to be read here.
cp "$dir/tests/lint/testdata/history_refs_bad.txt" "$tmp/bad.cc"
cp "$dir/tests/lint/testdata/history_refs_good.txt" "$tmp/good.cc"
check "each kind of reference in bad.cc is found, with its line" \
  '! python3 "$lint" "$tmp/bad.cc" > "$tmp/out" &&
   [ "$(grep -c "bad.cc:[0-9]*:" "$tmp/out")" = 8 ] &&
   grep -q "bad.cc:1: issue number" "$tmp/out" && grep -q "bad.cc:2: issue number" "$tmp/out" &&
   grep -q "bad.cc:3: issue number .issue[1]9" "$tmp/out" &&
   grep -q "bad.cc:4: session number" "$tmp/out" &&
   [ "$(grep -c "bad.cc:5: wave number" "$tmp/out")" = 2 ] &&
   [ "$(grep -c "bad.cc:6: helper name" "$tmp/out")" = 2 ] || { cat "$tmp/out"; false; }'
check "the legitimate words in good.cc pass" \
  'python3 "$lint" "$tmp/good.cc" > "$tmp/out" || { cat "$tmp/out"; false; }'
# The references below are spelled in two parts: this script is itself read by the lint.
iss=issue wav=wave
named="$tmp/run_${iss}7/${wav}2_probe.cc"
mkdir -p "$(dirname "$named")"
cp "$tmp/good.cc" "$named"
check "a file name carrying a reference is found" \
  '! python3 "$lint" "$named" > "$tmp/out" &&
   [ "$(grep -c "(file name)" "$tmp/out")" = 2 ] || { cat "$tmp/out"; false; }'
printf 'x.cc: %s 3  # why\ny.cc: %s 9  # matches nothing\n' "$iss" "$wav" > "$tmp/allow.txt"
printf '// %s 3 here\n' "$iss" > "$tmp/x.cc"
check "an allowlist entry that matches nothing is a finding" \
  '(cd "$tmp" && ! python3 "$lint" --allowlist allow.txt x.cc > out) &&
   grep -q "allow.txt:2: allowlist entry matches nothing" "$tmp/out" &&
   ! grep -q "^x.cc:1" "$tmp/out" || { cat "$tmp/out"; false; }'

# The project itself: the runfiles link back to the checkout, whose tracked files are read. CI
# (deploy/dev.sh test) runs from a git checkout; anywhere else this fails, saying so.
src=$(dirname "$(dirname "$(dirname "$(readlink -f "$lint")")")")
if [ -e "$src/.git" ] && command -v git > /dev/null; then
  check "no references in the project's tracked files (outside the allowlist)" \
    'python3 "$lint" --root "$src" --allowlist "$allow" > "$tmp/out" || { cat "$tmp/out"; false; }'
  tail -1 "$tmp/out"
else
  echo "FAIL the source checkout is not reachable from the runfiles ($src): run from a git checkout"
  fail=1
fi
exit $fail
