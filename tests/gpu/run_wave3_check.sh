#!/usr/bin/env bash
# The coordinator's one-H200 check of a wave's GPU changes at one commit, from .devpack_v/
# (built here: bazel build //daemon:kvraild //examples:kv_demo //tests/gpu:{relay_gpu_test,
# fabric_kernel_bench,layout_bench,cuda_engine_gpu_test,stream_wait_gpu_test,kv_copy_gpu_test,
# issue19_g1_bench}; packed with /work/briefs/devpack_to .devpack_v bazel-bin/...). Runs, each
# under its own timeout and process group: the relay hop byte for byte (R == S on one GPU) and
# through two daemons (relay forced vs off), the named layouts at 32 and 132 CTAs with the per-plan
# kernel choice, the CUDA engine's GPU test cases (plan upload from staging, copy-engine-only mode,
# kernel + copy engines, large tables, a dying client), the fused kernel against its host twin
# (every layout family, the narrow set), the GPU stream wait (every case, the hidden probes of
# calls made while a wait is parked), the first transfer and the critical path through kvraild,
# and the GPU demo. PARTS picks steps (default: all of relay layouts engine kernel streamwait
# g1 demo). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
# pack, out, LD_LIBRARY_PATH, the runfiles tree with kvraild, run_group (a program as the leader
# of its own process group; the group is ended after it returns).
source tests/gpu/pack_env.sh .devpack_v
# The dying-client case spawns kv_demo from the runfiles.
mkdir -p "$rf/kvrail/examples"
ln -s "$PWD/$pack/bin/kv_demo" "$rf/kvrail/examples/kv_demo"
step() {  # NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  run_group timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0)) s"
}
nvidia-smi -L; date -u
bin=$pack/bin
parts=${PARTS:-relay layouts engine kernel streamwait g1 demo}
want() { [[ " $parts " == *" $1 "* ]]; }
if want relay; then
  step relay_gpu_test 60 $bin/relay_gpu_test -s
  grep -E "passed|failed|FAILED" "$out/relay_gpu_test.txt" | tail -3
  for relay in gpu:0 off; do
    KVRAIL_FABRIC_RELAY=$relay step "bench_relay_${relay%%:*}" 60 \
        $bin/fabric_kernel_bench --mib 64 --reps 2 --copy-pair 0 --src-gpu 0 --dst-gpu 0
    grep -E "^\||mismatch|FAIL" "$out/bench_relay_${relay%%:*}.txt" | head -12
  done
fi
if want layouts; then
  step layouts 100 $bin/layout_bench
  grep -E "^\||MISMATCH" "$out/layouts.txt" | cut -c1-200
fi
if want engine; then
  step engine_test 120 $bin/cuda_engine_gpu_test \
      '*kernel: random layouts GPU->GPU*,*copy engines only*,*tiny-run plans*,*4 fixed CTAs*,*kernel + copy engines*,*large block tables*,*deferred id checks*,a client that dies*'
  grep -E "passed|failed|FAILED" "$out/engine_test.txt" | tail -3
fi
if want kernel; then
  step kernel_test 90 $bin/kv_copy_gpu_test '~[bandwidth]'
  grep -E "passed|failed|FAILED" "$out/kernel_test.txt" | tail -3
fi
if want streamwait; then
  step stream_wait 60 $bin/stream_wait_gpu_test --durations yes
  grep -E "passed|failed|FAILED|latency|s: stream wait" "$out/stream_wait.txt" | tail -12
  step stream_wait_parked 30 $bin/stream_wait_gpu_test '[create-while-parked]'
  grep -vE "^$" "$out/stream_wait_parked.txt" | tail -14
fi
if want g1; then
  for p in first latency; do
    step "g1_$p" 90 $bin/issue19_g1_bench $p
    grep -E "^\||p50|first|FAIL" "$out/g1_$p.txt" | head -30
  done
fi
want demo || { date -u; exit 0; }
echo "== demo"
d=$(mktemp -d /tmp/demo.XXXXXX)
setsid $bin/kvraild --socket "$d/k.sock" --log-level info > "$out/demo_daemon.txt" 2>&1 &
dp=$!
for _ in $(seq 100); do [ -S "$d/k.sock" ] && break; sleep 0.1; done
setsid $bin/kv_demo prefill --socket "$d/k.sock" --info "$d/p.json" --seed 42 --ignore-stdin \
    > "$out/demo_prefill.txt" 2>&1 &
pp=$!
timeout 60 $bin/kv_demo decode --socket "$d/k.sock" --info "$d/p.json" > "$out/demo.txt" 2>&1
echo "decode exit $?"; tail -3 "$out/demo.txt"
kill -TERM -- "-$pp" 2>/dev/null; wait "$pp"
kill -TERM -- "-$dp" 2>/dev/null; wait "$dp"; echo "kvraild exit $?"
date -u
