#!/usr/bin/env bash
# Issues 17.5 / 19.1 kernels on one GPU (GPU0 -> GPU0), from .devpack_g3/ (built here, packed by
# /work/briefs/devpack_to .devpack_g3 with layout_bench, digest_gpu_test, kv_copy_gpu_test).
# PARTS picks what runs (default "layouts digest_cost digest_test kernel_test"); logs go to $OUT.
# DEVPACK names another pack folder (issue 19 NL: DEVPACK=.devpack_nl PARTS="layouts kernel_test"
# LAYOUT_RANDOM=12, run as `bash tests/gpu/run_g3.sh`); LAYOUT_RANDOM adds random layouts,
# LAYOUT_ONLY=i,j,... keeps only those layout_bench cases; PARTS "ncu" profiles kernels (below).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
pack=${DEVPACK:-.devpack_g3}
export LD_LIBRARY_PATH=$PWD/$pack/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
parts=${PARTS:-layouts digest_cost digest_test kernel_test}
nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; date -u
bin=$pack/bin
step() {  # $1 name, $2 timeout, rest: command
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0)) s"
}
if [[ $parts == *layouts* ]]; then
  step layouts ${LAYOUT_TIMEOUT:-120} $bin/layout_bench ${LAYOUT_ARGS:-}
  grep -E '^\|' "$out/layouts.txt"; grep -i mismatch "$out/layouts.txt" | head -5
fi
if [[ $parts == *digest_cost* ]]; then
  step digest_cost 120 $bin/digest_gpu_test '[bandwidth]'
  grep -E 'SUMMARY|blocks ->' "$out/digest_cost.txt" | cut -c1-220
fi
if [[ $parts == *digest_test* ]]; then
  step digest_test 100 $bin/digest_gpu_test '~[bandwidth]'
  grep -E 'digest cases|passed|failed|FAILED' "$out/digest_test.txt" | head -8
fi
if [[ $parts == *ncu* ]]; then
  # Nsight Compute on one timed 32-CTA launch of each segment form named in NCU_KERNELS
  # ("regex@launches to skip" pairs; ncu matches the kernel's function name, not the mangled one:
  # '^KvCopySegmentsSplitKernel$@178'), with LAYOUT_ONLY=${NCU_ONLY:-16}: where the SM's time goes.
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  if [[ -z $ncu_bin ]]; then
    echo "== ncu: not found"
  else
    for spec in ${NCU_KERNELS:-}; do
      name=${spec%@*}; skip=${spec#*@}
      step "ncu_${name//[^A-Za-z0-9]/_}" ${NCU_TIMEOUT:-45} \
        env LAYOUT_ONLY=${NCU_ONLY:-16} LAYOUT_RANDOM=${LAYOUT_RANDOM:-10} \
        "$ncu_bin" -k "regex:$name" --launch-skip "$skip" --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
        --section MemoryWorkloadAnalysis --section SchedulerStats $bin/layout_bench
      grep -E "Duration|Throughput|Stall|Issued Ipc|Warp Cycles|Registers|Achieved Occupancy" \
        "$out/ncu_${name//[^A-Za-z0-9]/_}.txt" | head -40
      grep -E "ERR|Eligible|One or More" "$out/ncu_${name//[^A-Za-z0-9]/_}.txt" | head -10
    done
  fi
fi
if [[ $parts == *kernel_test* ]]; then
  step kernel_test ${KERNEL_TEST_TIMEOUT:-120} $bin/kv_copy_gpu_test '~[bandwidth]'
  grep -E 'passed|failed|FAILED|REQUIRE|CHECK|first mismatch' "$out/kernel_test.txt" | head -12
fi
date -u
