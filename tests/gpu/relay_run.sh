#!/usr/bin/env bash
# Issue 18 item 3 on a GPU machine, from .devpack_hr/ (tests/gpu/relay_pack.sh; PACK names
# another): the relay hop through the daemon's RelayStage byte for byte (relay_gpu_test: R == S
# on one GPU; S=0 -> R=1 and the reverse on two), then two daemons on loopback moving GPU -> GPU
# with a head split and NHD->HND (fabric_kernel_bench, which verifies the destination) with the
# relay forced (KVRAIL_FABRIC_RELAY=gpu:R in both daemons' environment) and, for comparison,
# without it (KVRAIL_FABRIC_RELAY=off). On two GPUs: GPU0 -> relay GPU1 -> NIC -> GPU1 (the
# sender's hop over NVLink) and GPU1 -> NIC -> relay GPU1 -> GPU0 (the receiver's). On one GPU:
# R == S == 0. Logs in $OUT. Every program runs in its own process group, ended by its id after.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/pack_env.sh .devpack_hr
nvidia-smi -L; nvidia-smi topo -m 2>/dev/null | head -5; date -u
gpus=$(nvidia-smi -L | grep -c '^GPU')
echo "== relay_gpu_test (byte for byte, poisoned destinations; $gpus GPUs)"
run_group timeout 240 "$pack/bin/relay_gpu_test" -s > "$out/relay_gpu_test.txt" 2>&1
echo "exit $?"; grep -E "relay_gpu_test:|FAILED|passed|failed|skipped" "$out/relay_gpu_test.txt" | tail -8
bench() {  # NAME RELAY ARGS...
  local name=$1 relay=$2; shift 2
  echo "== two daemons, KVRAIL_FABRIC_RELAY=$relay $*"
  KVRAIL_FABRIC_RELAY=$relay run_group timeout "${BENCH_TIMEOUT:-150}" \
      "$pack/bin/fabric_kernel_bench" --mib "${MIB:-64}" --reps "${REPS:-2}" --copy-pair 0 "$@" \
      > "$out/bench_$name.txt" 2>&1
  echo "exit $?"; grep -E "^\||verified|mismatch|FAIL|error" "$out/bench_$name.txt" | head -20
}
if [ "$gpus" -ge 2 ]; then
  bench relay01 gpu:1 --src-gpu 0 --dst-gpu 1
  bench relay10 gpu:1 --src-gpu 1 --dst-gpu 0
  bench direct01 off --src-gpu 0 --dst-gpu 1
else
  bench relay00 gpu:0 --src-gpu 0 --dst-gpu 0
  bench direct00 off --src-gpu 0 --dst-gpu 0
fi
