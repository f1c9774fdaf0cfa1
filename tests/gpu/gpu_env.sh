# Sourced by the run_*.sh scripts on the GPU machine: runfiles for the harness, the library path,
# NVLink multicast off, and an MPS control daemon that is always stopped (leftover kvraild children
# of a failed benchmark are MPS clients, and `quit` waits for every client).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp}
export LD_LIBRARY_PATH=$PWD/.devpack/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rf=$(mktemp -d /tmp/rf.XXXXXX)
mkdir -p "$rf/kvrail/daemon" "$rf/kvrail/client"
ln -s "$PWD/.devpack/bin/kvraild" "$rf/kvrail/daemon/kvraild"
[ -e .devpack/bin/kv_demo ] && ln -s "$PWD/.devpack/bin/kv_demo" "$rf/kvrail/client/kv_demo"
export TEST_SRCDIR=$rf TEST_WORKSPACE=kvrail

# Daemons a failed benchmark left behind (started through the runfiles symlink) and helpers.
kill_leftovers() {
  pkill -TERM -f 'kvrail/daemon/kvraild|devpack/bin/kvraild'; sleep 1
  pkill -KILL -f 'kvrail/daemon/kvraild|devpack/bin/kvraild|gemm_load.py|nccl_baseline.py'
  return 0
}
start_mps() {
  kill_leftovers
  command -v nvidia-cuda-mps-control >/dev/null || return 1
  export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/mps-pipe.XXXXXX)
  export CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/mps-log.XXXXXX)
  nvidia-cuda-mps-control -d
}
stop_mps() {
  kill_leftovers

  timeout 30 sh -c 'echo quit | nvidia-cuda-mps-control' || echo "MPS quit timed out"
}
