#!/usr/bin/env bash
# Builds the kvraild container image from the project's Debian package, without a container
# engine and without pulling a base image from a registry:
#   1. `bazel build --config=release //deploy:deb` (the .deb operators install);
#   2. make_rootfs.sh: debootstrap --variant=minbase bookworm from Debian's archive, then
#      `apt install ./kvrail_<version>_amd64.deb` inside it (apt resolves the Depends; the
#      package's postinst makes the kvrail user and group, uid/gid 990 as the DaemonSet expects);
#   3. build_oci.py: an OCI image layout OUT_DIR/kvraild-oci (one layer, labelled
#      org.opencontainers.image.version/revision/source/..., tagged with the version).
#
#   deploy/container/build.sh [OUT_DIR]     (root; needs debootstrap and network to Debian)
#   skopeo copy oci:OUT_DIR/kvraild-oci:<version> docker-daemon:kvraild:<version>   # Docker
#   podman pull oci:OUT_DIR/kvraild-oci:<version>                                    # Podman
#   skopeo copy oci:OUT_DIR/kvraild-oci:<version> docker://REGISTRY/kvraild:<version>
# KVRAIL_DEB=path skips step 1; KVRAIL_SOURCE_URL sets the source label (default: the git
# remote "origin", else the checkout's path). Containerfile beside this script is the same image
# for engines that build (FROM scratch over the root file system's tar).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/kvrail-image}
mkdir -p "$out"
if [ -z "${KVRAIL_DEB:-}" ]; then
  bazel build --config=release //deploy:deb
  KVRAIL_DEB="$(bazel info --config=release bazel-bin 2>/dev/null)/deploy/kvrail_amd64.deb"
fi
version=$(dpkg-deb -f "$KVRAIL_DEB" Version)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || revision="$revision-dirty"
source_url=${KVRAIL_SOURCE_URL:-$(git remote get-url origin 2>/dev/null || echo "file://$PWD")}
rootfs="$out/rootfs"
rm -rf "$rootfs" "$out/kvraild-oci"
deploy/container/make_rootfs.sh "$rootfs" "$KVRAIL_DEB"
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)} \
  python3 deploy/container/build_oci.py --rootfs "$rootfs" --out "$out/kvraild-oci" \
  --version "$version" --revision "$revision" --source "$source_url"
sed "s/@VERSION@/$version/g; s/@REVISION@/$revision/g; s#@SOURCE@#$source_url#g" \
  deploy/container/Containerfile > "$out/Containerfile"
echo "image: $out/kvraild-oci (OCI layout, tag $version); root file system: $rootfs"
echo "load: skopeo copy oci:$out/kvraild-oci:$version docker-daemon:kvraild:$version"
echo "  or: podman pull oci:$out/kvraild-oci:$version"
