#!/bin/bash
# The lint finds the pipeline that failed CI (and its kin) in a made-up script, passes their safe
# forms, and finds nothing in the project's errexit+pipefail scripts.
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
lint="$dir/tests/lint/early_exit_pipe_lint.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

# The samples are .txt files: the lint's own list of scripts must not hold its bad examples.
cp "$dir/tests/lint/testdata/early_readers.txt" "$tmp/bad.sh"
cp "$dir/tests/lint/testdata/safe_readers.txt" "$tmp/good.sh"
# Without pipefail the status is not acted on: not checked.
sed 's/set -euo pipefail/set -u/' "$tmp/bad.sh" > "$tmp/lax.sh"

check "the five early readers in bad.sh are each found" \
  '! python3 "$lint" "$tmp/bad.sh" > "$tmp/out" && [ "$(grep -c "^early-exit reader" "$tmp/out")" = 5 ] &&
   grep -q "bad.sh:3:" "$tmp/out" && grep -q "bad.sh:6:" "$tmp/out" && grep -q "bad.sh:8:" "$tmp/out"'
check "their safe forms pass" 'python3 "$lint" "$tmp/good.sh" > "$tmp/out"'
check "a script without errexit+pipefail is not checked" \
  'python3 "$lint" "$tmp/lax.sh" > "$tmp/out" && grep -q "^0 scripts" "$tmp/out"'

scripts=()
for s in client/c_api/exports_test.sh deploy/container/build.sh deploy/container/make_rootfs.sh \
  deploy/deb/build_deb.sh deploy/dev.sh deploy/pyvenv.sh python/run_tests.sh \
  python/run_torch_tests.sh tests/deploy/deb_install_test.sh tests/deploy/deb_test.sh \
  tests/deploy/deploy_test.sh tests/deploy/k8s_validate_test.sh tests/deploy/lintian_test.sh \
  tests/deploy/oci_test.sh tests/deploy/promtool_test.sh \
  tests/bench/fast_path_targets.sh tests/gpu/devpack.sh tests/gpu/pack.sh tests/gpu/pack_check_test.sh \
  tests/lint/early_exit_pipe_test.sh tests/nixl/gpu_check.sh tests/nixl/nixl_bench.sh \
  tests/nixl/nixl_plugin_test.sh tests/wheel/wheel_install_test.sh tools/bench/versus.sh tools/bench/versus/pack_peers.sh \
  tools/bench/versus_smoke_test.sh tools/wheel/build.sh; do
  scripts+=("$dir/$s")
done
check "the project's ${#scripts[@]} errexit+pipefail scripts have no early reader" \
  'python3 "$lint" "${scripts[@]}" > "$tmp/out";
   grep -q "^${#scripts[@]} scripts .* 0 findings" <<<"$(tail -1 "$tmp/out")" || { cat "$tmp/out"; false; }'
# A new script that sets both and is not listed above: found when the source tree is reachable
# (bazel test runs from a checkout; the runfiles link back to it).
src=$(dirname "$(dirname "$(dirname "$(readlink -f "$lint")")")")
if [ -d "$src/.git" ] && command -v git > /dev/null; then
  check "every tracked errexit+pipefail script is listed in tests/lint/BUILD" \
    'listed=$(printf "%s\n" "${scripts[@]#$dir/}" | sort);
     tracked=$(cd "$src" && git ls-files "*.sh" | while read -r f; do
       grep -qE "^\s*set\s+-[a-z]*e[a-z]*o\s+pipefail" "$f" && echo "$f"; done | sort);
     [ "$listed" = "$tracked" ] || { diff <(echo "$listed") <(echo "$tracked"); false; }'
fi
exit $fail
