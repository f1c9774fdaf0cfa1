#!/usr/bin/env bash
# The GPU stream wait's diagnostics on one GPU, from the GPU pack (tests/gpu/pack.sh; carry
# .gpupack: the pack is unpacked with tests/gpu/run.sh unpack) or from the pack folder DEVPACK
# names (tests/gpu/devpack.sh -o DEVPACK ...). The routine runs are tests/gpu/run.sh's
# stream-wait and streaming steps; this script keeps the probes below:
#  1. the one-GPU hang shown: the byte-for-byte case in the old order (the producer kernel not
#     loaded before the engine's waits; KVRAIL_SW_NO_PRELOAD=1), bounded by a short timeout, and
#     the same with CUDA_MODULE_LOADING=EAGER;
#  2. stream_wait_gpu_test (every case; the "[latency]" lines) without MPS;
#  3. flags_gpu_test FLAG_RUNS processes x FLAG_ROUNDS handovers without MPS;
#  4. under MPS: stream_wait_gpu_test, the flag runs, and streaming_bench --streaming-only with
#     kvraild's readiness poller (cuda_stream_wait false) and with the GPU stream wait (true).
# PARTS picks (default "hang test flags mps"); also "streaming" (the two streaming rows under
# MPS), "probe" (hardware queues: the first run), "final" (the second run: the
# streaming rows, every case and the flag runs with and without MPS) and "parked" (which calls
# wait while another stream's wait is pending; not run yet).
# Logs go to $OUT. Run: bash tests/gpu/run_stream_wait.sh (DEVPACK names another pack folder).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
if [[ -n ${DEVPACK:-} ]]; then pack=$PWD/$DEVPACK; else pack=$(bash tests/gpu/run.sh unpack) || exit 2; fi
export LD_LIBRARY_PATH=$pack/lib:$LD_LIBRARY_PATH
ln -sf "$pack/bin/kvraild" "$rf/kvrail/daemon/kvraild"
nvidia-smi -L; date -u
parts=${PARTS:-hang test flags mps}

flag_loop() {  # $1: label
  local pass=0 fail=0 i
  for i in $(seq "${FLAG_RUNS:-10}"); do
    if KVRAIL_FLAGS_ROUNDS=${FLAG_ROUNDS:-10} run_group timeout 30 "$pack/bin/flags_gpu_test" \
        > "$out/flags_$1_$i.txt" 2>&1; then
      pass=$((pass + 1)); rm -f "$out/flags_$1_$i.txt"
    else
      fail=$((fail + 1)); echo "run $i failed:"; tail -8 "$out/flags_$1_$i.txt"
    fi
  done
  echo "flags $1: $pass passed, $fail failed (runs of ${FLAG_ROUNDS:-10} handovers each)"
}
sw_test() {  # $1: label
  local t0=$SECONDS
  run_group timeout ${SW_TIMEOUT:-40} "$pack/bin/stream_wait_gpu_test" --durations yes > "$out/stream_wait_$1.txt" 2>&1
  echo "exit $? after $((SECONDS - t0)) s"
  grep -E "latency|context-synchronizing\?|passed|failed|FAILED|s: stream wait" "$out/stream_wait_$1.txt" | tail -24
}

# "probe" (the one-process hang under MPS): which streams a pending wait holds up and
# its release time (stream_wait_gpu_test "[queues]") for several hardware-queue counts, and the
# byte-for-byte case where it hung, without and with MPS.
queues() {  # $1: label; the environment says the rest
  run_group timeout 20 "$pack/bin/stream_wait_gpu_test" "[queues]" > "$out/queues_$1.txt" 2>&1
  echo "exit $?"; grep -E "^queues|FAILED|passed|failed" "$out/queues_$1.txt"
}
byte_case() {  # $1: label, $2: timeout
  local t0=$SECONDS
  run_group timeout "$2" "$pack/bin/stream_wait_gpu_test" \
      "stream wait: nothing moves before the flags*" > "$out/byte_$1.txt" 2>&1
  echo "byte case $1: exit $? after $((SECONDS - t0)) s"; tail -2 "$out/byte_$1.txt"
}
if [[ $parts == *probe* ]]; then
  echo "== probe, no MPS"
  queues nomps_default
  CUDA_DEVICE_MAX_CONNECTIONS=1 queues nomps_c1
  CUDA_DEVICE_MAX_CONNECTIONS=32 queues nomps_c32
  CUDA_DEVICE_MAX_CONNECTIONS=1 byte_case nomps_c1 12
  if start_mps; then
    echo "== probe, MPS"
    queues mps_default
    CUDA_DEVICE_MAX_CONNECTIONS=8 queues mps_c8
    CUDA_DEVICE_MAX_CONNECTIONS=32 queues mps_c32
    byte_case mps_default 10
    CUDA_DEVICE_MAX_CONNECTIONS=32 byte_case mps_c32 20
    for c in 32 8; do
      echo "== streaming_bench under MPS, cuda_stream_wait 1, kvraild CUDA_DEVICE_MAX_CONNECTIONS=$c"
      CUDA_DEVICE_MAX_CONNECTIONS=$c run_group timeout 60 "$pack/bin/streaming_bench" \
          --streaming-only --reps ${REPS:-21} --stream-wait 1 > "$out/streaming_sw1_c$c.txt" 2>&1
      echo "exit $?"; head -14 "$out/streaming_sw1_c$c.txt"
    done
    echo "== streaming_bench under MPS, cuda_stream_wait 0"
    run_group timeout 60 "$pack/bin/streaming_bench" --streaming-only --reps ${REPS:-21} \
        --stream-wait 0 > "$out/streaming_sw0.txt" 2>&1
    echo "exit $?"; head -14 "$out/streaming_sw0.txt"
    stop_mps
  fi
fi
# "final" (after the fixes): under MPS the streaming rows first (the
# target), then every stream_wait_gpu_test case (the one-process byte case included) and the
# queue probe at the driver's default, the flag runs; then without MPS the flag runs and the
# test again. Ordered by importance: the device time may end before the last parts.
if [[ $parts == *final* ]]; then
  if start_mps; then
    for sw in 1 0; do
      echo "== streaming_bench under MPS, cuda_stream_wait $sw"
      run_group timeout 60 "$pack/bin/streaming_bench" --streaming-only --reps ${REPS:-21} \
          --stream-wait $sw > "$out/streaming_sw$sw.txt" 2>&1
      echo "exit $?"; head -14 "$out/streaming_sw$sw.txt"
    done
    echo "== stream_wait_gpu_test (MPS, the test asks for 32 queues)"
    sw_test mps
    echo "== the byte case under MPS at the driver's default queues (engine pool only)"
    KVRAIL_SW_DRIVER_QUEUES=1 byte_case mps_driver 10
    echo "== probe under MPS, driver's default queues"
    KVRAIL_SW_DRIVER_QUEUES=1 queues mps_driver
    echo "== flags_gpu_test (MPS)"; flag_loop mps
    stop_mps
    # gpu_env.sh leaves the pipe directory exported: the probe would call the next runs MPS.
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
  echo "== flags_gpu_test (no MPS)"; flag_loop nomps
  echo "== probe, no MPS, driver's default queues"
  KVRAIL_SW_DRIVER_QUEUES=1 queues nomps_driver
  echo "== stream_wait_gpu_test (no MPS)"
  sw_test nomps
fi
# "parked": which runtime calls wait while another stream's wait is pending (stream creation is
# the suspect: docs/benchmarks_archive.md (the stream wait)), without and with MPS.
if [[ $parts == *parked* ]]; then
  for mode in nomps mps; do
    if [[ $mode == mps ]]; then start_mps || continue; fi
    echo "== calls while a wait is pending ($mode)"
    run_group timeout 30 "$pack/bin/stream_wait_gpu_test" "[create-while-parked]" \
        > "$out/parked_$mode.txt" 2>&1
    echo "exit $?"; grep -E "^while a wait|FAILED|passed|failed" "$out/parked_$mode.txt"
    if [[ $mode == mps ]]; then stop_mps; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; fi
  done
fi
if [[ $parts == *hang* ]]; then
  echo "== the old order (KVRAIL_SW_NO_PRELOAD=1), no MPS, 12 s timeout"
  t0=$SECONDS
  KVRAIL_SW_NO_PRELOAD=1 run_group timeout 12 "$pack/bin/stream_wait_gpu_test" \
      "stream wait: nothing moves before the flags*" > "$out/sw_nopreload.txt" 2>&1
  echo "exit $? after $((SECONDS - t0)) s"; tail -4 "$out/sw_nopreload.txt"
  echo "== the same with CUDA_MODULE_LOADING=EAGER"
  t0=$SECONDS
  CUDA_MODULE_LOADING=EAGER KVRAIL_SW_NO_PRELOAD=1 run_group timeout 30 "$pack/bin/stream_wait_gpu_test" \
      "stream wait: nothing moves before the flags*" > "$out/sw_eager.txt" 2>&1
  echo "exit $? after $((SECONDS - t0)) s"; tail -3 "$out/sw_eager.txt"
fi
if [[ $parts == *test* ]]; then
  echo "== stream_wait_gpu_test (no MPS)"
  sw_test nomps
fi
[[ $parts == *flags* ]] && { echo "== flags_gpu_test (no MPS)"; flag_loop nomps; }
# "streaming" runs only the streaming_bench rows under MPS (the one-process stream_wait_gpu_test
# under MPS is known to hang: docs/benchmarks_archive.md, the stream wait).
if [[ $parts == *mps* || $parts == *streaming* ]] && start_mps; then
  if [[ $parts == *mps* ]]; then
    echo "== stream_wait_gpu_test (MPS)"
    sw_test mps
  fi
  [[ $parts == *flags* ]] && { echo "== flags_gpu_test (MPS)"; flag_loop mps; }
  for sw in 0 1; do
    echo "== streaming_bench under MPS, cuda_stream_wait $sw"
    run_group timeout 60 "$pack/bin/streaming_bench" --streaming-only --reps ${REPS:-21} \
        --stream-wait $sw > "$out/streaming_sw$sw.txt" 2>&1
    echo "exit $?"; cat "$out/streaming_sw$sw.txt" | head -20
  done
  stop_mps
fi
date -u
