#!/usr/bin/env bash
# GPU machine: the GPU validation, from the pack tests/gpu/pack.sh made (carry .gpupack/), as
# named steps of at most ~9 minutes each (the device tool's calls last at most 10):
#   bash tests/gpu/run.sh one-gpu [STEP...]   # GPU0 -> GPU0
#   bash tests/gpu/run.sh two-gpu [STEP...]   # GPU0 -> GPU1, plus the steps that need two GPUs
#   bash tests/gpu/run.sh list                # the steps: limit, expected duration, what they do
#   bash tests/gpu/run.sh unpack              # unpacks the pack, prints its folder (bin/ lib/ py/)
# No STEP: every step of the shape, in order (longer than one call: name a few steps per call;
# `list` says which fit together). A step of the other shape may be named too (e.g. one-gpu
# scattered runs the 1 GiB table GPU0 -> GPU0). Each step prints its table as it completes,
# appends it to $OUT/tables.md and rewrites $OUT/logs.tgz (every log so far), so a call cut off
# by its limit still brings back what finished. OUT defaults to /tmp/kvrail-gpu-out.
# The Python with torch is found (/opt/torch/.venv, then python3/python on PATH: the first that
# imports torch); PYTHON is exported for the benchmarks' helpers. Every program runs in a
# process group of its own, ended by its id afterwards; the MPS control daemon a step starts is
# stopped before the step ends. Nothing else on the machine is touched.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
all_args=("$@")

# --- Steps: NAME|SHAPES (default lists)|LIMIT s|EXPECTED s|WHAT. Limits come from the durations
# docs/benchmarks.md records (each part's longest seen, x1.5-2, within 9 minutes); EXPECTED is
# what a healthy run took there.
steps=(
  "tests|one two|480|150|every GPU test binary but the daemon's (kernel, digest, import, relay, fabric kernels, stream wait): passed/failed/skipped per binary"
  "sm80|one two|240|60|the kernels' pre-sm_90 forms (A100, L40): copy and digest built as compute_80 PTX only, JIT-compiled as sm_80 code on this GPU, against the host twin and digests (ptx80_gpu_test): passed/failed/skipped"
  "engine-tests|one two|480|210|the daemon end to end (cuda_engine_gpu_test), the consumer-side flags (flags_gpu_test) and the GPU-written completion (done_word_gpu_test): passed/failed/skipped"
  "restart|one two|180|40|hot restart with GPU regions: a successor kvraild takes over while 3 clients keep CUDA-engine transfers between GPU regions in flight; bytes read back, pre-restart regions used after: passed/failed/skipped"
  "model|one two|560|300|model handover: prefill process on the source GPU, decode on the destination, tokens vs one process, handover vs TTFT, bulk vs streaming"
  "python|one two|300|60|Python 16 MiB overhead vs the C++ client (same daemon, interleaved); per-layer and cuMem regions"
  "layouts|one two|420|110|named + 12 random layouts through the kernel vs the aligned layout, at the default 32 CTAs and tuned 132"
  "first|one two|360|150|first transfer vs warm (warm-up on/off) and the first transfer's phases"
  "streaming|one two|420|200|layer-wise streaming vs bulk under MPS: the last layer's tail after prefill's last kernel"
  "critical|one two|480|200|16 MiB critical transfer latency (phases), done seen with and without the GPU-written done word, the kernel + copy-engine split at 4-128 KiB, and the latency at a 2 ms cadence with the spins covering the gap against kvraild's and the client's CPU"
  "scattered|two|560|300|1 GiB scattered at 4/16/32/128 KiB vs the copy engine's contiguous ceiling: shipped defaults, then tuned"
  "gemm|two|560|320|8192^3 bf16 GEMM alone vs beside a transfer at the shipped defaults, 10 alternating pairs under MPS"
  "relay|two|420|120|relay hop over NVLink byte for byte, through two daemons (relay vs direct); the digest's cost across GPUs"
  "topology|-|120|20|nvidia-smi's topology beside kvrail's (topo_probe --dump, kvrail topo on a live daemon)"
  "demo|-|120|15|the GPU demo (kv_demo prefill and decode through one kvraild), as deploy/dev.sh demo"
  "fabric|-|480|120|the fabric kernels byte for byte and their pack rate; two daemons GPU -> GPU through the fabric (loopback tcp)"
  "fabric-host|-|300|120|host -> host through two daemons over tcp;ofi_rxm on the GPU machine's CPUs, against fi_pingpong"
  "interference|-|560|400|GEMM in another process beside transfers at several SM budgets and on the copy engines (MPS)"
  "stream-wait|-|420|120|the GPU stream wait (every case) and 10 x 10 flag handovers, without and with MPS"
  "versus|-|560|300|the repository's tools/bench/versus_gpu.py (kvrail vs Mooncake, NIXL, NCCL, torch) on this pair; the peers from .gpucarry/peers.tar.xz (tools/bench/versus/pack_peers.sh) or VERSUS_PYTHONPATH"
)
field() { local IFS='|'; local f=($1); echo "${f[$2]}"; }

usage() {
  sed -n 2,15p "$0"
  echo
  printf '%-13s %-8s %-6s %-9s %s\n' STEP SHAPES LIMIT EXPECTED WHAT
  for s in "${steps[@]}"; do
    printf '%-13s %-8s %-6s %-9s %s\n' "$(field "$s" 0)" "$(field "$s" 1)" "$(field "$s" 2)s" \
      "~$(field "$s" 3)s" "$(field "$s" 4)"
  done
  echo
  echo "Steps of shape '-' run only when named. A call stops starting steps after CALL_SECONDS" \
    "(570 s; a step is cut to what is left)." \
    "Calls that fit by the expected times: 'tests engine-tests python restart', 'sm80 layouts first" \
    "critical', 'model', 'streaming relay', 'scattered', 'gemm'."
}
shape=${1:-}
case $shape in
  one-gpu) src=0 dst=0 short=one ;;
  two-gpu) src=0 dst=1 short=two ;;
  list | -h | --help) usage; exit 0 ;;
  unpack) short="" ;;  # no steps: unpacks the pack and prints its folder
  *) usage >&2; exit 2 ;;
esac
shift
wanted=("$@")
if [[ ${#wanted[@]} -eq 0 ]]; then
  for s in "${steps[@]}"; do [[ " $(field "$s" 1) " == *" $short "* ]] && wanted+=("$(field "$s" 0)"); done
fi
for w in "${wanted[@]}"; do
  known=0
  for s in "${steps[@]}"; do [[ $(field "$s" 0) == "$w" ]] && known=1; done
  [[ $known == 1 ]] || { echo "run.sh: no step '$w' (run.sh list)" >&2; exit 2; }
done

# --- The pack: run from inside it (bin/, lib/, py/, tests/gpu/ of one build). From the
# repository root, unpack .gpupack/gpupack.tar.xz once per machine and run the pack's own copy.
root=$(cd "$here/../.." && pwd)
if [[ ! -x $root/bin/kvraild || ! -f $root/MANIFEST ]]; then
  archive=${PACK:-$root/.gpupack}/gpupack.tar.xz
  if [[ ! -f $archive ]]; then
    echo "run.sh: no $archive: build it with tests/gpu/pack.sh and carry .gpupack" >&2
    exit 2
  fi
  sum=$(cksum < "$archive" | cut -d' ' -f1)
  dest=/tmp/kvrail-gpupack-$sum
  if [[ ! -f $dest/.unpacked ]]; then
    rm -rf "$dest" && mkdir -p "$dest"
    if command -v xz > /dev/null; then
      tar -C "$dest" -xJf "$archive"
    else
      py=$(command -v python3 || echo /opt/torch/.venv/bin/python)
      "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$archive" "$dest"
    fi || { echo "run.sh: could not unpack $archive" >&2; exit 2; }
    touch "$dest/.unpacked"
  fi
  # The checkout the pack came with (steps that run the repository's own tools find it here).
  KVRAIL_TREE=$root exec bash "$dest/tests/gpu/run.sh" "${all_args[@]}"
fi
cd "$root" || exit 2
if [[ $shape == unpack ]]; then
  echo "$root"
  exit 0
fi

# --- The machine.
final=${OUT:-/tmp/kvrail-gpu-out}
mkdir -p "$final"
logs=$(mktemp -d /tmp/kvrail-gpu-logs.XXXXXX)
tables=$final/tables.md
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
need=$(( dst + 1 ))
{
  echo "# kvrail GPU run: $shape (GPU$src -> GPU$dst), steps: ${wanted[*]}"
  echo "$(date -u '+%F %T UTC'); pack: $(head -1 MANIFEST | sed 's/^# //'); $gpus GPU(s):"
  nvidia-smi -L 2>/dev/null | sed 's/ (UUID.*//'
} | tee -a "$tables"
if (( gpus < need )); then
  echo "SKIPPED: $shape needs $need GPUs, found $gpus: nothing run" | tee -a "$tables"
  exit 3
fi
nvidia-smi topo -m > "$logs/topology.txt" 2>&1

export LD_LIBRARY_PATH=$root/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$root/py:$root/tests/gpu PYTHONUNBUFFERED=1 KVRAIL_LIB=$root/lib/libkvrail.so
# The programs find kvraild (and kv_demo) as under bazel test: a runfiles tree.
rf=$(mktemp -d /tmp/kvrail-rf.XXXXXX)
mkdir -p "$rf/kvrail/daemon" "$rf/kvrail/examples"
ln -s "$root/bin/kvraild" "$rf/kvrail/daemon/kvraild"
ln -s "$root/bin/kv_demo" "$rf/kvrail/examples/kv_demo"
export TEST_SRCDIR=$rf TEST_WORKSPACE=kvrail

# The Python with torch: found, not configured.
PYTHON=""
for p in /opt/torch/.venv/bin/python3 /opt/torch/.venv/bin/python /opt/*/.venv/bin/python3 \
  "$(command -v python3 2> /dev/null)" "$(command -v python 2> /dev/null)"; do
  [[ -n $p && -x $p ]] || continue
  if "$p" -c 'import torch' > /dev/null 2>&1; then PYTHON=$p; break; fi
done
export PYTHON
echo "python with torch: ${PYTHON:-none found} $([[ -n $PYTHON ]] && "$PYTHON" -c 'import torch, sys; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.device_count(), "GPUs")' 2>&1)" | tee -a "$tables"

# --- Processes: each program leads a process group of its own, ended by that group's id.
started_groups=()
mps_pid=""
end_group() {
  kill -TERM -- "-$1" 2> /dev/null || return 0
  for _ in $(seq 20); do kill -0 -- "-$1" 2> /dev/null || return 0; sleep 0.1; done
  kill -KILL -- "-$1" 2> /dev/null || true
}
run_group() {  # LIMIT_S COMMAND...: the command's status (124: its limit)
  local limit=$1
  shift
  setsid timeout -k 10 "$limit" "$@" &
  local pid=$!
  started_groups+=("$pid")
  wait "$pid"
  local rc=$?
  end_group "$pid"
  local keep=() g
  for g in "${started_groups[@]}"; do [[ $g != "$pid" ]] && keep+=("$g"); done
  started_groups=("${keep[@]}")
  return $rc
}
start_mps() {
  command -v nvidia-cuda-mps-control > /dev/null || return 1
  export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/kvrail-mps-pipe.XXXXXX)
  export CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/kvrail-mps-log.XXXXXX)
  nvidia-cuda-mps-control -d || return 1
  for _ in $(seq 20); do
    [[ -s $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid ]] && break
    sleep 0.1
  done
  mps_pid=$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2> /dev/null || true)
  [[ -n $mps_pid ]] || mps_pid=unknown
}
stop_mps() {
  [[ -n $mps_pid ]] || return 0
  if ! timeout 30 sh -c 'echo quit | nvidia-cuda-mps-control'; then
    echo "MPS quit timed out"
    [[ $mps_pid =~ ^[0-9]+$ ]] && kill -KILL "$mps_pid" 2> /dev/null
  fi
  mps_pid=""
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
end_all() {
  local g
  for g in "${started_groups[@]}"; do end_group "$g"; done
  stop_mps
  tar -C "$logs" -czf "$final/logs.tgz" . 2> /dev/null
}
trap end_all EXIT

# --- Helpers for the steps. A step writes its table lines with `row`; its logs go to $logs.
step_deadline=0
left() { echo $(( step_deadline - SECONDS )); }
row() { echo "$*" | tee -a "$tables"; }
# Runs one program under min(LIMIT, the step's time left); logs to $logs/LOG.txt. Prints nothing.
prog() {  # LOG LIMIT COMMAND...
  local log=$1 limit=$2
  shift 2
  local l
  l=$(left)
  (( l < limit )) && limit=$l
  if (( limit < 5 )); then
    echo "not run: the step's time ran out" > "$logs/$log.txt"
    return 124
  fi
  local t0=$SECONDS
  run_group "$limit" "$@" > "$logs/$log.txt" 2>&1
  local rc=$?
  echo "[exit $rc after $((SECONDS - t0)) s, limit $limit s]" >> "$logs/$log.txt"
  return $rc
}
# A Catch2 GPU test binary: one table row with passed / failed / skipped test cases. A case
# that lacks GPUs prints "SKIPPED: <case>: needs N GPUs, found M" and returns: Catch2 counts it
# as passed (no failed assertion), so it is taken off the passed count here. Zero GPUs: every
# case is skipped, none passed.
catch2() {  # BINARY LIMIT [CATCH2 ARGS...]
  local bin=$1 limit=$2
  shift 2
  local t0=$SECONDS rc name=$bin n=1
  while [[ -e $logs/$name.txt ]]; do n=$((n + 1)); name=${bin}_$n; done  # a second run keeps both
  prog "$name" "$limit" "bin/$bin" "$@"
  rc=$?
  local log=$logs/$name.txt total=0 passed=0 failed=0 skipped line
  skipped=$(grep -E '^SKIPPED: ' "$log" | sort -u | wc -l)
  if line=$(grep -E '^All tests passed \(' "$log" | tail -1) && [[ -n $line ]]; then
    total=$(sed -E 's/.* in ([0-9,]+) test case.*/\1/' <<< "$line" | tr -d ,)
    passed=$total
  elif line=$(grep -E '^test cases: ' "$log" | tail -1) && [[ -n $line ]]; then
    total=$(sed -E 's/^test cases: *([0-9,]+).*/\1/' <<< "$line" | tr -d ,)
    passed=$(grep -oE '[0-9,]+ passed' <<< "$line" | tr -d ', passed' || echo 0)
    failed=$(grep -oE '[0-9,]+ failed' <<< "$line" | head -1 | tr -d ', failed' || echo 0)
  fi
  passed=$(( ${passed:-0} - skipped ))
  (( passed < 0 )) && passed=0
  local verdict=ok
  if (( rc == 124 || rc == 137 )); then verdict="TIMED OUT"
  elif (( rc != 0 || failed > 0 )); then verdict=FAILED
  elif (( total == 0 )); then verdict="no cases ran"
  elif (( passed == 0 )); then verdict="all skipped"
  fi
  row "| $bin $* | $passed | ${failed:-0} | $skipped | $verdict (exit $rc) | $((SECONDS - t0)) s |"
  grep -E '^SKIPPED: ' "$log" | sort -u | sed 's/^/  /' | tee -a "$tables"
  grep -E -A3 '^[^ ].*FAILED:$' "$log" | head -20 | sed 's/^/  /' | tee -a "$tables"
  [[ $verdict == ok || $verdict == "all skipped" ]]
}
catch2_header() {
  row "| binary | passed | failed | skipped (needs more GPUs) | verdict | time |"
  row "|---|---|---|---|---|---|"
}
# The table lines a program printed (markdown rows and the lines named by PATTERN) into tables.md.
show() {  # LOG [EXTRA_PATTERN]
  grep -E "^\||${2:-^##}|^(median|MISMATCH|FAIL|error)" "$logs/$1.txt" | tee -a "$tables"
  tail -1 "$logs/$1.txt" | tee -a "$tables"
}
pair="--src-gpu $src --dst-gpu $dst"

# --- The steps.
step_tests() {
  local rc=0
  catch2_header
  catch2 cuda_import_gpu_test 60 || rc=1
  catch2 kv_copy_gpu_test 150 '~[bandwidth]' || rc=1
  catch2 digest_gpu_test 150 '~[bandwidth]' || rc=1
  catch2 relay_gpu_test 90 -s || rc=1
  catch2 fabric_kernel_gpu_test 300 '~[bandwidth]' || rc=1
  catch2 stream_wait_gpu_test 90 --durations yes || rc=1
  return $rc
}
step_sm80() {
  local rc=0
  catch2_header
  catch2 ptx80_gpu_test 200 --durations yes || rc=1
  grep -E '^GPU [0-9]+: |^cases: ' "$logs/ptx80_gpu_test.txt" | tee -a "$tables"
  return $rc
}
step_engine-tests() {
  local rc=0
  catch2_header
  catch2 cuda_engine_gpu_test 330 --durations yes || rc=1
  catch2 flags_gpu_test 120 || rc=1
  catch2 done_word_gpu_test 90 --durations yes || rc=1
  return $rc
}
step_restart() {
  local rc=0
  catch2_header
  catch2 hot_restart_gpu_test 150 --durations yes || rc=1
  return $rc
}
step_model() {
  [[ -n $PYTHON ]] || { row "SKIPPED: model: no Python with torch found"; return 1; }
  # MODEL_RUNS: the handover modes in order (model_handover.py --runs); one of each fits a call.
  prog model_handover 540 "$PYTHON" tests/gpu/model_handover.py driver --daemon "$root/bin/kvraild" \
    --prefill-gpu "$src" --decode-gpu "$dst" --runs "${MODEL_RUNS:-bulk,streaming}"
  local rc=$?
  grep -E '^\||^run: |handover|reference|mismatch|Error|error' "$logs/model_handover.txt" |
    tail -40 | tee -a "$tables"
  row "model handover: exit $rc"
}
step_python() {
  [[ -n $PYTHON ]] || { row "SKIPPED: python: no Python with torch found"; return 1; }
  local d sock daemon rc=0
  d=$(mktemp -d /tmp/kvrail-py.XXXXXX)
  sock=$d/k.sock
  setsid "$root/bin/kvraild" --socket "$sock" --log-level info > "$logs/kvraild_python.txt" 2>&1 &
  daemon=$!
  started_groups+=("$daemon")
  for _ in $(seq 100); do grep -q "ready: " "$logs/kvraild_python.txt" 2> /dev/null && break; sleep 0.1; done
  prog python_overhead 180 "$PYTHON" tests/gpu/python_overhead.py --socket "$sock" \
    --cxx-bench "$root/bin/submit_latency_bench" $pair || rc=1
  show python_overhead
  prog per_layer_gpu 120 "$PYTHON" tests/gpu/per_layer_gpu.py --socket "$sock" || rc=1
  row "per-layer CUDA regions: $(tail -3 "$logs/per_layer_gpu.txt" | tr '\n' ' ')"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True prog cumem_gpu 120 "$PYTHON" \
    tests/gpu/cumem_gpu.py --socket "$sock" || rc=1
  row "cuMem regions: $(tail -3 "$logs/cumem_gpu.txt" | tr '\n' ' ')"
  end_group "$daemon"
  return $rc
}
step_layouts() {
  LAYOUT_RANDOM=12 prog layouts 400 bin/layout_bench $pair
  local rc=$?
  show layouts
  return $rc
}
step_first() {
  local rc=0
  prog first_vs_warm 150 bin/first_transfer_bench first $pair || rc=1
  show first_vs_warm
  prog first_phases 200 bin/critical_path_bench first $pair || rc=1
  show first_phases
  return $rc
}
step_streaming() {
  local rc=0
  start_mps || row "(no MPS control daemon: the streaming rows run without MPS)"
  # The GPU stream wait with the priorities table, then the readiness poller's streaming rows alone.
  for sw in 1 0; do
    prog "streaming_sw$sw" 200 bin/streaming_bench --stream-wait "$sw" \
      $([[ $sw == 0 ]] && echo --streaming-only) $pair || rc=1
    row "### streaming_bench, cuda_stream_wait $sw$([[ -n $mps_pid ]] && echo ', under MPS')"
    show "streaming_sw$sw" 'tail|target|streaming|bulk|critical'
  done
  stop_mps
  return $rc
}
step_critical() {
  local rc=0
  prog critical_latency 150 bin/critical_path_bench latency $pair || rc=1
  show critical_latency 'p50|phase'
  prog done_word 120 bin/critical_path_bench doneword $pair || rc=1
  show done_word 'doneword'
  prog copy_split 200 bin/critical_path_bench split $pair || rc=1
  show copy_split
  # Last: 27 fresh daemons; what it leaves of the step is its limit.
  prog critical_cadence 240 bin/critical_path_bench cadence $pair || rc=1
  show critical_cadence 'cadence|idle spin|^  run '
  return $rc
}
step_scattered() {
  prog scattered 540 bin/cuda_engine_bench --tables 1 $pair
  local rc=$?
  show scattered 'ceiling|shipped|tuned|device:'
  return $rc
}
step_gemm() {
  local rc=0
  start_mps || row "(no MPS control daemon: GEMM and kvraild time-slice)"
  prog gemm_pairs 540 bin/cuda_engine_bench --gemm-pairs 10 $pair || rc=1
  show gemm_pairs 'GEMM|pair|kept'
  stop_mps
  return $rc
}
step_relay() {
  local rc=0
  catch2_header
  catch2 relay_gpu_test 90 -s || rc=1
  for relay in "gpu:$dst" off; do
    KVRAIL_FABRIC_RELAY=$relay prog "relay_${relay%%:*}" 120 bin/fabric_kernel_bench --mib 64 \
      --reps 3 --copy-pair 0 $pair || rc=1
    row "### two daemons, KVRAIL_FABRIC_RELAY=$relay"
    show "relay_${relay%%:*}" 'verified|mismatch'
  done
  prog digest_cost 150 bin/digest_gpu_test '[bandwidth]' || rc=1
  row "### the digest's cost (digest_gpu_test [bandwidth], GPU$src -> GPU$dst: KVRAIL_GPU_PAIR)"
  grep -E 'SUMMARY|blocks ->|^\|' "$logs/digest_cost.txt" | cut -c1-220 | tee -a "$tables"
  return $rc
}
step_topology() {
  nvidia-smi topo -m 2>&1 | tee -a "$tables"
  prog topo_probe 30 bin/topo_probe --dump
  local d dp rc=0
  d=$(mktemp -d /tmp/kvrail-topo.XXXXXX)
  setsid bin/kvraild --socket "$d/k.sock" > "$logs/kvraild_topology.txt" 2>&1 &
  dp=$!
  started_groups+=("$dp")
  for _ in $(seq 100); do [[ -S $d/k.sock ]] && break; sleep 0.1; done
  prog kvrail_topo 30 bin/kvrail --socket "$d/k.sock" topo || rc=1
  tee -a "$tables" < "$logs/kvrail_topo.txt"
  end_group "$dp"
  return $rc
}
step_demo() {
  local d dp pp rc
  d=$(mktemp -d /tmp/kvrail-demo.XXXXXX)
  setsid bin/kvraild --socket "$d/k.sock" --log-level info > "$logs/kvraild_demo.txt" 2>&1 &
  dp=$!
  started_groups+=("$dp")
  for _ in $(seq 100); do [[ -S $d/k.sock ]] && break; sleep 0.1; done
  setsid bin/kv_demo prefill --socket "$d/k.sock" --info "$d/p.json" --seed 42 --ignore-stdin \
    > "$logs/demo_prefill.txt" 2>&1 &
  pp=$!
  started_groups+=("$pp")
  prog demo_decode 60 bin/kv_demo decode --socket "$d/k.sock" --info "$d/p.json"
  rc=$?
  tail -5 "$logs/demo_decode.txt" | tee -a "$tables"
  end_group "$pp"
  end_group "$dp"
  return $rc
}
step_fabric() {
  local rc=0
  catch2_header
  catch2 fabric_kernel_gpu_test 300 '~[bandwidth]' || rc=1
  prog fabric_pack_rate 90 bin/fabric_kernel_gpu_test '[bandwidth]' || rc=1
  grep -E 'fabric pack' "$logs/fabric_pack_rate.txt" | tee -a "$tables"
  prog fabric_kernel_bench 180 bin/fabric_kernel_bench --copy-pair 0 $pair || rc=1
  show fabric_kernel_bench 'verified|mismatch'
  return $rc
}
step_fabric-host() {
  PATH=$root/bin:$PATH prog fabric_host 280 bin/fabric_bench --host-loopback --mib 512 --reps 3
  local rc=$?
  show fabric_host
  return $rc
}
step_interference() {
  local rc=0
  start_mps || row "(no MPS control daemon: GEMM and kvraild time-slice)"
  prog interference 540 bin/cuda_engine_bench --interference $pair || rc=1
  show interference 'GEMM'
  stop_mps
  return $rc
}
# FLAG runs of flags_gpu_test (10 handovers each), counted.
flag_runs() {  # LABEL
  local pass=0 fail=0 skip=0 i
  for i in $(seq 10); do
    if ! KVRAIL_FLAGS_ROUNDS=10 prog "flags_$1_$i" 40 bin/flags_gpu_test; then
      fail=$((fail + 1))
    elif grep -q '^SKIPPED: ' "$logs/flags_$1_$i.txt"; then
      skip=$((skip + 1))
    else
      pass=$((pass + 1))
    fi
  done
  row "flags_gpu_test $1: $pass runs passed, $fail failed, $skip skipped (10 handovers each)"
  (( fail == 0 ))
}
step_stream-wait() {
  local rc=0
  catch2_header
  catch2 stream_wait_gpu_test 90 --durations yes || rc=1
  flag_runs nomps || rc=1
  if start_mps; then
    catch2 stream_wait_gpu_test 90 --durations yes || rc=1
    flag_runs mps || rc=1
    stop_mps
  else
    row "(no MPS control daemon: the MPS half not run)"
  fi
  return $rc
}
step_versus() {
  local tool=${KVRAIL_TREE:-}/tools/bench/versus_gpu.py
  [[ -f $tool ]] || { row "SKIPPED: versus: no $tool (run run.sh from the checkout)"; return 1; }
  [[ -n $PYTHON ]] || { row "SKIPPED: versus: no Python with torch found"; return 1; }
  # The peers' bundle (tools/bench/versus/pack_peers.sh), carried as .gpucarry/peers.tar.xz.
  local peers=${VERSUS_PEERS:-$KVRAIL_TREE/.gpucarry/peers.tar.xz}
  if [[ -z ${VERSUS_PYTHONPATH:-} && -f $peers ]]; then
    local pdest=/tmp/kvrail-peers-$(cksum < "$peers" | cut -d' ' -f1)
    if [[ ! -f $pdest/.unpacked ]]; then
      rm -rf "$pdest" && mkdir -p "$pdest" &&
        "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
          "$peers" "$pdest" && touch "$pdest/.unpacked" ||
        row "versus: could not unpack $peers (the peers' rows will say their module does not import)"
    fi
    VERSUS_PYTHONPATH=$pdest/py
  fi
  PYTHONPATH=$PYTHONPATH${VERSUS_PYTHONPATH:+:$VERSUS_PYTHONPATH} prog versus 540 "$PYTHON" "$tool" \
    --kvraild "$root/bin/kvraild" --pairs "$src-$dst"
  local rc=$?
  show versus 'FAILED|not a result'
  return $rc
}
export KVRAIL_GPU_PAIR="$src,$dst"

# The whole call stays within CALL_SECONDS (default 570: the device tool ends a command at 600):
# a step gets the smaller of its limit and what is left; none starts with under 30 s left.
call_end=$(( SECONDS + ${CALL_SECONDS:-570} ))
for w in "${wanted[@]}"; do
  for s in "${steps[@]}"; do [[ $(field "$s" 0) == "$w" ]] && spec=$s; done
  limit=$(field "$spec" 2)
  if (( call_end - SECONDS < 30 )); then
    row "== $w: not started (the call's ${CALL_SECONDS:-570} s are spent; run it in another call)"
    continue
  fi
  (( limit > call_end - SECONDS )) && limit=$(( call_end - SECONDS ))
  step_deadline=$(( SECONDS + limit ))
  row ""
  row "## $w ($shape, GPU$src -> GPU$dst; limit ${limit} s, expected ~$(field "$spec" 3) s): $(field "$spec" 4)"
  t0=$SECONDS
  "step_$w"
  rc=$?
  row "== $w: $([[ $rc == 0 ]] && echo ok || echo "FAILED (status $rc)") after $((SECONDS - t0)) s"
  tar -C "$logs" -czf "$final/logs.tgz" .
done
