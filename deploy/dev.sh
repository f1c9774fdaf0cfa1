#!/usr/bin/env bash
# The developer entry point. Verbs:
#   demo   install what is missing, build, start kvraild, move a Llama-3-8B-shaped KV cache between
#          two client processes through it, verify it byte for byte, stop cleanly.
#   test   install what is missing, build, run every test CI runs, then the clang thread-safety
#          build (counted as one test); ends with "N passed, N failed".
#   build  install what is missing and build.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  bazel-bootstrap bazel-rules-java bazel-platforms
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev libfmt-dev catch2 libcli11-dev nlohmann-json3-dev
  libfabric-dev libfabric-bin libibverbs-dev librdmacm-dev libhwloc-dev libnuma-dev
  prometheus-cpp-dev iproute2 procps python3 python3-yaml systemd
  python3-pytest python3-numpy python3-protobuf python3-setuptools
  clang
)

log() { printf '[dev.sh] %s\n' "$*" >&2; }

ensure_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if [ ! -x /usr/local/cuda/bin/nvcc ]; then
    log "error: the CUDA toolkit (nvcc) is expected at /usr/local/cuda; kernels/ cannot be compiled without it"
    exit 1
  fi
}

BAZEL=(bazel)

build() {
  ensure_packages
  "${BAZEL[@]}" build //daemon:kvraild //tools/kvrail:kvrail //examples:kv_demo
}

DEMO_DIR="" DAEMON_PID="" PREFILL_PID=""
demo_cleanup() {
  [ -n "$PREFILL_PID" ] && kill "$PREFILL_PID" 2>/dev/null || true
  if [ -n "$DAEMON_PID" ]; then kill -TERM "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null || true; fi
  [ -n "$DEMO_DIR" ] && rm -rf "$DEMO_DIR"
  return 0
}

demo() {
  build
  DEMO_DIR=$(mktemp -d /tmp/kvrail-demo.XXXXXX)
  trap demo_cleanup EXIT
  local sock="$DEMO_DIR/kvrail.sock"
  bazel-bin/daemon/kvraild --socket "$sock" --log-level warn &
  DAEMON_PID=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || { log "kvraild did not start"; exit 1; }
  log "kvraild running (pid $DAEMON_PID, socket $sock)"
  # The prefill process lives until its stdin closes: a fifo held open by this shell.
  mkfifo "$DEMO_DIR/prefill.stdin"
  bazel-bin/examples/kv_demo prefill --socket "$sock" --info "$DEMO_DIR/prefill.json" --seed 42 \
    < "$DEMO_DIR/prefill.stdin" &
  PREFILL_PID=$!
  exec 3>"$DEMO_DIR/prefill.stdin"
  bazel-bin/examples/kv_demo decode --socket "$sock" --info "$DEMO_DIR/prefill.json"
  bazel-bin/tools/kvrail/kvrail --socket "$sock" transfers
  exec 3>&-
  wait "$PREFILL_PID"
  PREFILL_PID=""
  kill -TERM "$DAEMON_PID"
  wait "$DAEMON_PID"
  DAEMON_PID=""
  log "demo done: kvraild stopped cleanly"
}

# The clang thread-safety build (.bazelrc's --config=tsa) runs in its own output base, so the
# clang toolchain never invalidates the GCC build's cache. It compiles (no linking) the libraries
# and binaries of base, the daemon and the client; tests only with KVRAIL_TSA_TESTS=1 (they double
# its time on CI's two cores, and a test's locking bug cannot reach the daemon). Then it checks
# that the analysis is really on: //base/tsa_canary reads a guarded field without its lock and
# must be rejected.
TSA_OUTPUT_BASE="${KVRAIL_TSA_OUTPUT_BASE:-$HOME/.cache/bazel-clang-tsa}"
TSA_SCOPE="//base/... + //daemon/... + //client/..."

# Prints the clang builds' output; returns 0 only when the real targets compile and the canary
# does not.
tsa_build() {
  local tsa=(bazel "--output_base=$TSA_OUTPUT_BASE")
  local kinds="cc_library|cc_binary" targets rc=0 canary
  [ "${KVRAIL_TSA_TESTS:-0}" = 1 ] && kinds="$kinds|cc_test"
  targets=$("${tsa[@]}" query --noshow_progress \
    "kind('($kinds) rule', $TSA_SCOPE) except attr(tags, 'manual', $TSA_SCOPE)") || rc=1
  if [ "$rc" -eq 0 ]; then
    # shellcheck disable=SC2086  # one target label per word
    "${tsa[@]}" build --config=tsa --keep_going $targets || rc=1
  fi
  canary=$("${tsa[@]}" build --config=tsa //base/tsa_canary:unguarded_read 2>&1)
  if [ $? -eq 0 ] || ! grep -q "requires holding mutex" <<<"$canary"; then
    printf '%s\n' "$canary" >&2
    log "the thread-safety analysis is not active: //base/tsa_canary compiled or failed otherwise"
    rc=1
  else
    log "//base/tsa_canary rejected as it must be: the analysis is on"
  fi
  "${tsa[@]}" shutdown  # its server would otherwise hold memory next to the GCC build's
  return "$rc"
}

run_tests() {
  ensure_packages
  local out
  out=$(mktemp)
  set +e
  "${BAZEL[@]}" test --test_tag_filters=-gpu,-manual --build_tests_only //... 2>&1 | tee "$out"
  local rc=${PIPESTATUS[0]}
  set -e
  local passed failed
  passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$out" || true)
  failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)' "$out" || true)
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # a build failure is a failure
  rm -f "$out"
  log "clang thread-safety build (--config=tsa, output base $TSA_OUTPUT_BASE)"
  local tsa_start=$SECONDS
  if (set +e; tsa_build); then
    log "thread-safety build PASSED in $((SECONDS - tsa_start)) s"
    passed=$((passed + 1))
  else
    log "thread-safety build FAILED in $((SECONDS - tsa_start)) s (the clang errors are above)"
    failed=$((failed + 1))
  fi
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

case "${1:-}" in
  demo) demo ;;
  test) run_tests ;;
  build) build ;;
  *) echo "usage: deploy/dev.sh demo|test|build" >&2; exit 2 ;;
esac
