# Sourced (not run) by the GPU-machine scripts that run programs from a devpack, after they cd to
# the repository root: `source tests/gpu/pack_env.sh DEFAULT_PACK`. Sets pack (PACK, else
# DEFAULT_PACK) and out (OUT, else /tmp), puts the pack's libraries first on LD_LIBRARY_PATH,
# keeps NCCL_NVLS_ENABLE=0, gives the programs a runfiles tree holding the pack's kvraild
# (TEST_SRCDIR/TEST_WORKSPACE, as under bazel test), and defines run_group: runs a command in its
# own process group and ends that group by its id afterwards; returns the command's status.
pack=${PACK:-$1}
out=${OUT:-/tmp}
export LD_LIBRARY_PATH=$PWD/$pack/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
rf=$(mktemp -d /tmp/rf.XXXXXX)
mkdir -p "$rf/kvrail/daemon"
ln -s "$PWD/$pack/bin/kvraild" "$rf/kvrail/daemon/kvraild"
export TEST_SRCDIR=$rf TEST_WORKSPACE=kvrail
run_group() {
  setsid "$@" &
  local pid=$!
  wait "$pid"
  local rc=$?
  kill -TERM -- "-$pid" 2>/dev/null
  return $rc
}
