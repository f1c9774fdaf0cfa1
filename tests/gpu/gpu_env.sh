# Sourced by run_stream_wait.sh on the GPU machine (tests/gpu/run.sh needs none of it): runfiles
# for the harness, the library path (.devpack/lib; the sourcing script points at its pack),
# NVLink multicast off, an MPS control daemon that is always stopped, and the bookkeeping that
# ends exactly the processes the script started (below).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp}
export LD_LIBRARY_PATH=$PWD/.devpack/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rf=$(mktemp -d /tmp/rf.XXXXXX)
mkdir -p "$rf/kvrail/daemon" "$rf/kvrail/examples"
ln -s "$PWD/.devpack/bin/kvraild" "$rf/kvrail/daemon/kvraild"
[ -e .devpack/bin/kv_demo ] && ln -s "$PWD/.devpack/bin/kv_demo" "$rf/kvrail/examples/kv_demo"
export TEST_SRCDIR=$rf TEST_WORKSPACE=kvrail

# Processes this script started, ended by their ids only, never by name: the machine may run
# other people's kvraild and python processes. A benchmark runs in a process group of its own
# (run_group), so the daemons and python helpers (gemm_load.py, nccl_baseline.py) it starts, and
# leaves behind when it fails, are ended through that group's id; a plain child (a demo daemon)
# is tracked by its pid (track / untrack); the MPS control daemon by the pid it records. The EXIT
# trap ends whatever is still running.
started_pids=()
started_groups=()
mps_pid=""

track() { started_pids+=("$1"); }
# After `wait`: the pid is reaped and may be reused, so it is no longer ours to signal.
untrack() {
  local keep=() p
  for p in "${started_pids[@]}"; do [[ $p != "$1" ]] && keep+=("$p"); done
  started_pids=("${keep[@]}")
}

# Ends what is left of process group $1 (TERM, then KILL after a second). Returns at once when the
# group is empty.
end_group() {
  kill -TERM -- "-$1" 2>/dev/null || return 0
  for _ in $(seq 10); do kill -0 -- "-$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL -- "-$1" 2>/dev/null || true
}

# Runs "$@" (a benchmark or a test that starts daemons) as the leader of a new process group,
# waits for it, then ends what it left in its group. Returns its exit status.
run_group() {
  setsid "$@" &
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
  command -v nvidia-cuda-mps-control >/dev/null || return 1
  export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/mps-pipe.XXXXXX)
  export CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/mps-log.XXXXXX)
  nvidia-cuda-mps-control -d || return 1
  # The control daemon forks into the background and records its pid beside its pipes.
  for _ in $(seq 20); do
    [[ -s $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid ]] && break
    sleep 0.1
  done
  mps_pid=$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2>/dev/null || true)
  [[ -z $mps_pid ]] && mps_pid=unknown
  # Logged so a run shows whether the pid file was where this script expects it.
  echo "mps: control daemon pid $mps_pid ($(ls "$CUDA_MPS_PIPE_DIRECTORY" | tr '\n' ' '))"
  return 0
}
# `quit` waits for every MPS client; run_group has already ended the ones this script started.
stop_mps() {
  [[ -z $mps_pid ]] && return 0
  if ! timeout 30 sh -c 'echo quit | nvidia-cuda-mps-control'; then
    echo "MPS quit timed out"
    [[ $mps_pid =~ ^[0-9]+$ ]] && kill -KILL "$mps_pid" 2>/dev/null
  fi
  mps_pid=""
  return 0
}

end_started() {
  local p
  for p in "${started_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${started_groups[@]}"; do end_group "$p"; done
  stop_mps
}
trap end_started EXIT
