#!/usr/bin/env bash
# Device machine, from the repository root with .devpack carried: issue 5's host benchmark
# (tests/netns/fabric_bench: kvraild A -> kvraild B over tcp;ofi_rxm, against fi_pingpong over
# the same path) on the GPU machine's CPUs, which are many and otherwise idle, unlike the 2-vCPU
# build machine. That machine has no iproute2, so no namespaces: --host-loopback runs every row
# over 127.0.0.1. Logs to ${OUT:-/tmp}/fabric_host.txt.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
export PATH=$PWD/.devpack/bin:$PATH
{
  echo "== $(date -u) on $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), user $(id -un)"
  run_group timeout ${FABRIC_HOST_TIMEOUT:-200} .devpack/bin/fabric_bench ${FABRIC_HOST_ARGS:---host-loopback --mib 512 --reps 3}
  echo "exit $?"
  echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/fabric_host.txt" 2>&1
cat "$out/fabric_host.txt"
