#!/usr/bin/env bash
# Builds the kvraild container image from Debian packages only: no base image is pulled from a
# registry. debootstrap makes a minimal Debian 12 root file system from Debian's archive, the
# runtime libraries are installed into it with apt, the built binaries are copied in, and the
# result is a tarball that `docker import` / `podman import` turn into an image, or that
# Containerfile (FROM scratch) adds.
#
#   deploy/container/build.sh [OUT_DIR]        (root; needs debootstrap and network to Debian)
#   podman build -f OUT_DIR/Containerfile -t kvraild:<version> OUT_DIR
#   # or: docker import --change 'ENTRYPOINT ["/usr/bin/kvraild"]' OUT_DIR/kvrail-rootfs.tar kvraild:<version>
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/kvrail-image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
rootfs="$out/rootfs"
mkdir -p "$out"
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
# The image is the Debian package (deploy/deb) installed into a minimal Debian 12: apt resolves
# the package's Depends from the archive, so the image has exactly the runtime libraries.
bazel build -c opt //deploy:deb
deb="$(bazel info -c opt bazel-bin 2>/dev/null)/deploy/kvrail_amd64.deb"
version=$(dpkg-deb -f "$deb" Version)
rm -rf "$rootfs"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror"
# uid/gid 990, as the DaemonSet (deploy/k8s) expects; the package's postinst keeps an existing user.
chroot "$rootfs" /usr/sbin/groupadd --system --gid 990 kvrail
chroot "$rootfs" /usr/sbin/useradd --system --uid 990 --gid 990 --no-create-home --home-dir /nonexistent kvrail
cp "$deb" "$rootfs/tmp/kvrail.deb"
chroot "$rootfs" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends /tmp/kvrail.deb"
rm -f "$rootfs/tmp/kvrail.deb"
chroot "$rootfs" /usr/bin/ldd /usr/bin/kvraild | grep -q 'not found' && {
  echo "missing runtime libraries in the image:" >&2
  chroot "$rootfs" /usr/bin/ldd /usr/bin/kvraild | grep 'not found' >&2
  exit 1
}
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -cf "$out/kvrail-rootfs.tar" .
sed "s/@VERSION@/$version/g" deploy/container/Containerfile > "$out/Containerfile"
echo "image root file system: $out/kvrail-rootfs.tar (kvrail $version)"
echo "next: podman build -f $out/Containerfile -t kvraild:$version $out"
