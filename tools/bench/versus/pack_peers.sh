#!/usr/bin/env bash
# Build machine: packs the peers that versus_gpu.py compares kvrail with (NIXL's Python API and
# Mooncake Transfer Engine, cp312 wheels for the GPU machine's Python) into one bundle small enough
# to ride beside the GPU pack in the device tool's 64 MiB carry:
#   .gpucarry/peers.tar.xz   (PEERS_OUT names another file)
# The wheels are pinned and downloaded once into ~/.cache/kvrail/peer-wheels (PEER_WHEELS names a
# folder that already holds them). What versus_gpu.py never loads is left out: NIXL's expert-parallel
# package (three torch builds of one 30 MiB module), its storage and telemetry plugins with the
# libraries only they need, UCX's perftest modules; Mooncake's store, master, client, collective
# and expert-parallel modules. tests/gpu/run.sh's `versus` step unpacks the bundle when it is there.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${PEERS_OUT:-.gpucarry/peers.tar.xz}
wheels=${PEER_WHEELS:-$HOME/.cache/kvrail/peer-wheels}
nixl_pin=nixl-cu13==1.5.1
mooncake_pin=mooncake-transfer-engine-cuda13==0.3.14
limit_kib=$((46 * 1024))  # 64 MiB carry less the GPU pack (~16 MiB) and the tracked tree (~2 MiB)

mkdir -p "$wheels"
if ! compgen -G "$wheels/nixl_cu13-1.5.1-cp312-*.whl" > /dev/null ||
   ! compgen -G "$wheels/mooncake_transfer_engine_cuda13-0.3.14-cp312-*.whl" > /dev/null; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --dest "$wheels" "$nixl_pin" "$mooncake_pin"
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for w in "$wheels"/nixl_cu13-1.5.1-cp312-*.whl "$wheels"/mooncake_transfer_engine_cuda13-0.3.14-cp312-*.whl; do
  python3 -m zipfile -e "$w" "$stage/py"
done
cd "$stage/py"
rm -rf nixl_ep_cu13 nixl_cu13.scripts nixl_cu13.libs/ucx/libucx_perftest_*
for d in nixl_cu13.libs/nixl .nixl_cu13.mesonpy.libs/plugins; do
  find "$d" -name '*.so' ! -name 'libplugin_UCX.so' ! -name 'libplugin_POSIX.so' -delete
done
rm -f nixl_cu13.libs/libaws-* nixl_cu13.libs/libazure-* nixl_cu13.libs/libgusli_* \
  nixl_cu13.libs/libs2n-* nixl_cu13.libs/libxml2-* \
  .nixl_cu13.mesonpy.libs/libobj_utils.so
rm -f mooncake/_store.*.so mooncake/_ep.*.so mooncake/mooncake_client mooncake/mooncake_master \
  mooncake/libmooncake_pg*.so mooncake/libmooncake_ep_device.so mooncake/transfer_engine_bench
# Every library a kept module needs must still be here (the GPU machine cannot fetch one).
missing=0
while IFS= read -r so; do
  dir=$(dirname "$so")
  while read -r lib; do
    case $lib in
      libc.so*|libm.so*|libresolv.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++*|libgcc_s*|libcuda.so*|libcudart.so*|libnvidia*|libcurl.so.4|libibverbs.so.1|libmlx5.so.1|libnuma.so.1) continue ;;
    esac
    found=$(find . -name "$lib" -print -quit)
    [[ -n $found ]] || { echo "pack_peers: $so needs $lib, which is not in the bundle" >&2; missing=1; }
  done < <(readelf -d "$so" 2>/dev/null | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p')
done < <(find nixl_cu13 .nixl_cu13.mesonpy.libs nixl_cu13.libs/nixl mooncake -name '*.so*' -type f)
(( missing == 0 )) || exit 1
cd - > /dev/null
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" py
kib=$(( $(stat -c %s "$out") / 1024 ))
echo "pack_peers: $out ${kib} KiB (limit ${limit_kib} KiB): nixl-cu13 1.5.1, mooncake-transfer-engine-cuda13 0.3.14"
(( kib <= limit_kib )) || { echo "pack_peers: $out over ${limit_kib} KiB" >&2; exit 1; }
