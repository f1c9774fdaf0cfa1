#!/bin/bash
# The GPU code kvraild ships (bazel/cuda.bzl): every kernel library's fatbin carries SASS for
# sm_80 (A100), sm_89 (L4, L40) and sm_90a (H100, H200) and compute_90 PTX for newer GPUs.
set -eu
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
/usr/bin/python3 "$dir/tests/deploy/fatbin_arches.py" "$dir/daemon/kvraild" --elf 80,89,90 --ptx 90
echo "ok   kvraild carries sm_80, sm_89 and sm_90a code and compute_90 PTX"
