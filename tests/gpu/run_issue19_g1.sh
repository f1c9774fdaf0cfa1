#!/usr/bin/env bash
# Issue 19 (G1) on one GPU, from .devpack_g1/ (packed by tests/gpu/pack_issue19_g1.sh; DEVPACK names
# another pack folder, e.g. DEVPACK=.devpack_cp; BENCH_TIMEOUT: seconds per bench part, 300). PARTS picks
# what runs (default "engine split first latency flagwait flags"):
#   engine    cuda_engine_gpu_test (byte for byte, the kernel + copy-engine split case included);
#   split     issue19_g1_bench split (kernel only / learned / fixed / copy engines, 4-128 KiB);
#   first     issue19_g1_bench first (the first transfer's phases);
#   first_mps the same under the MPS control daemon;
#   latency   issue19_g1_bench latency (16 MiB critical transfer);
#   flagwait  flag_wait_bench (CPU poller vs stream wait vs persistent kernel);
#   flags     flags_gpu_test FLAG_RUNS x FLAG_ROUNDS handovers, without and with MPS.
# Logs go to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
pack=$PWD/${DEVPACK:-.devpack_g1}
export LD_LIBRARY_PATH=$pack/lib:$LD_LIBRARY_PATH
ln -sf "$pack/bin/kvraild" "$rf/kvrail/daemon/kvraild"
[ -e "$pack/bin/kv_demo" ] && ln -sf "$pack/bin/kv_demo" "$rf/kvrail/examples/kv_demo"
parts=${PARTS:-engine split first latency flagwait flags}
nvidia-smi -L; date -u

if [[ $parts == *engine* ]]; then
  echo "== cuda_engine_gpu_test"
  # ENGINE_FILTER: Catch2 test names (default: every case).
  run_group timeout 300 "$pack/bin/cuda_engine_gpu_test" ${ENGINE_FILTER:+"$ENGINE_FILTER"} \
      > "$out/engine_test.txt" 2>&1
  echo "exit $?"; grep -E "engine:|FAILED|passed|failed" "$out/engine_test.txt" | tail -20
fi
for p in split first latency; do
  if [[ " $parts " == *" $p "* ]]; then
    echo "== issue19_g1_bench $p"
    run_group timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/issue19_g1_bench" "$p" > "$out/bench_$p.txt" 2>&1
    echo "exit $?"; cat "$out/bench_$p.txt"
  fi
done
# first_mps: the first-transfer rows with kvraild and the bench as two MPS clients (one GPU
# context: no switch from the bench's context before the daemon's first kernel).
if [[ " $parts " == *" first_mps "* ]] && start_mps; then
  echo "== issue19_g1_bench first, under MPS"
  run_group timeout "${BENCH_TIMEOUT:-300}" "$pack/bin/issue19_g1_bench" first > "$out/bench_first_mps.txt" 2>&1
  echo "exit $?"; cat "$out/bench_first_mps.txt"
  stop_mps
fi
if [[ $parts == *flagwait* ]]; then
  echo "== flag_wait_bench"
  run_group timeout 120 "$pack/bin/flag_wait_bench" 50 > "$out/flag_wait.txt" 2>&1
  echo "exit $?"; cat "$out/flag_wait.txt"
fi
flag_loop() {  # $1: label
  local pass=0 fail=0 i
  for i in $(seq "${FLAG_RUNS:-10}"); do
    if KVRAIL_FLAGS_ROUNDS=${FLAG_ROUNDS:-10} run_group timeout 90 "$pack/bin/flags_gpu_test" \
        > "$out/flags_$1_$i.txt" 2>&1; then
      pass=$((pass + 1)); rm -f "$out/flags_$1_$i.txt"
    else
      fail=$((fail + 1)); echo "run $i failed:"; tail -20 "$out/flags_$1_$i.txt"
    fi
  done
  echo "flags $1: $pass passed, $fail failed (runs of ${FLAG_ROUNDS:-10} handovers each)"
}
if [[ " $parts " == *" flags "* ]]; then
  echo "== flags, no MPS"; flag_loop nomps
  if start_mps; then echo "== flags, MPS"; flag_loop mps; stop_mps; fi
fi
date -u
