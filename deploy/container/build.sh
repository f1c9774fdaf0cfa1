#!/usr/bin/env bash
# Builds the kvraild container image from Debian packages only: no base image is pulled from a
# registry. debootstrap makes a minimal Debian 12 root file system from Debian's archive, the
# runtime libraries are installed into it with apt, the built binaries are copied in, and the
# result is a tarball that `docker import` / `podman import` turn into an image, or that
# Containerfile (FROM scratch) adds.
#
#   deploy/container/build.sh [OUT_DIR]        (root; needs debootstrap and network to Debian)
#   podman build -f deploy/container/Containerfile -t kvraild:dev OUT_DIR
#   # or: docker import --change 'ENTRYPOINT ["/usr/bin/kvraild"]' OUT_DIR/kvrail-rootfs.tar kvraild:dev
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/kvrail-image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
rootfs="$out/rootfs"
mkdir -p "$out"
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
bazel build //daemon:kvraild //tools/kvrail:kvrail
bin=$(bazel info bazel-bin 2>/dev/null)
# Runtime libraries only (the -dev packages stay on the build machine).
runtime=libgrpc++1.51,libprotobuf32,libspdlog1.10,libfmt9,libfabric1,libibverbs1,librdmacm1,libhwloc15,libnuma1,libprometheus-cpp-core1.0,libprometheus-cpp-pull1.0,ca-certificates
rm -rf "$rootfs"
debootstrap --variant=minbase --include="$runtime" bookworm "$rootfs" "$mirror"
install -m 0755 "$bin/daemon/kvraild" "$bin/client/kvrail" "$rootfs/usr/bin/"
install -D -m 0644 deploy/config/kvraild.textproto "$rootfs/etc/kvrail/kvraild.textproto"
chroot "$rootfs" /usr/sbin/useradd --system --user-group --no-create-home --uid 990 kvrail
chroot "$rootfs" /usr/bin/ldd /usr/bin/kvraild | grep -q 'not found' && {
  echo "missing runtime libraries in the image:" >&2
  chroot "$rootfs" /usr/bin/ldd /usr/bin/kvraild | grep 'not found' >&2
  exit 1
}
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -cf "$out/kvrail-rootfs.tar" .
cp deploy/container/Containerfile "$out/"
echo "image root file system: $out/kvrail-rootfs.tar"
