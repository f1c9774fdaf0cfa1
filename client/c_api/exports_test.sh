#!/usr/bin/env bash
# libkvrail.so exports the C ABI (kvrail_*, version node KVRAIL_1) and nothing else, and every
# symbol it needs resolves from the system libraries it names (what a Python process gets when it
# loads the file).
set -euo pipefail
lib="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-kvrail}/client/c_api/libkvrail.so"
[ -f "$lib" ] || lib="client/c_api/libkvrail.so"

exported=$(nm -D --defined-only "$lib" | awk '{print $3}')
others=$(grep -vE '^(kvrail_[a-z0-9_]+@@KVRAIL_1|KVRAIL_1)$' <<<"$exported" || true)
if [ -n "$others" ]; then
  echo "libkvrail.so exports symbols outside the C ABI:" >&2
  head -20 <<<"$others" >&2
  exit 1
fi
for symbol in kvrail_abi_version kvrail_connect kvrail_submit kvrail_submit_batch kvrail_wait kvrail_poll \
  kvrail_register_host_fd kvrail_export_region kvrail_completion_fd kvrail_take_completions \
  kvrail_register_host_buffer kvrail_register_cuda kvrail_last_error_message; do
  grep -q "^${symbol}@@KVRAIL_1$" <<<"$exported" || { echo "missing export: $symbol" >&2; exit 1; }
done

unresolved=$(ldd -r "$lib" 2>&1 | grep -i 'undefined symbol' || true)
# Under a sanitizer build (.bazelrc --config=asan sets KVRAIL_SANITIZER) the library is
# instrumented and the sanitizer's runtime comes from the process that loads it: the runtime's
# own symbols are the only ones allowed to stay unresolved there.
if [ -n "${KVRAIL_SANITIZER:-}" ]; then
  unresolved=$(grep -vE 'undefined symbol: (__asan_|__ubsan_|__sanitizer_|__sancov_|__lsan_)' \
    <<<"$unresolved" || true)
fi
if [ -n "$unresolved" ]; then
  echo "libkvrail.so has unresolved symbols:" >&2
  head -20 <<<"$unresolved" >&2
  exit 1
fi
echo "libkvrail.so: $(wc -l <<<"$exported") exported symbols, all kvrail_*; every import resolves"
