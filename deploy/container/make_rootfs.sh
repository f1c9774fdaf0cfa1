#!/bin/bash
# A minimal Debian 12 root file system with the kvrail .deb installed by apt (which resolves its
# Depends from Debian's archive and runs its maintainer scripts: the kvrail user and group):
#
#   deploy/container/make_rootfs.sh ROOTFS KVRAIL_DEB      (root; network to Debian's mirror)
#
# debootstrap --variant=minbase bookworm runs once; its result is kept as a tarball in
# $KVRAIL_ROOTFS_CACHE (default ~/.cache/kvrail-rootfs of the user running it, renewed after 7
# days), and so are the packages apt downloads, so later runs only unpack and install. Nothing is
# mounted: apt and dpkg need no /proc here. Mirror: $DEBIAN_MIRROR (http://deb.debian.org/debian).
# Phase times go to stderr ("make_rootfs: debootstrap 61 s", ...).
# Exit status: 0 done, 3 the mirror cannot be reached (callers may skip), else a failure.
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
rootfs=$1 deb=$2
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
home=$(getent passwd "$(id -u)" | cut -d: -f6)
cache=${KVRAIL_ROOTFS_CACHE:-$home/.cache/kvrail-rootfs}
base="$cache/bookworm-minbase.tar"
say() { echo "make_rootfs: $*" >&2; }

[ "$(id -u)" -eq 0 ] || { say "needs root (debootstrap, chroot)"; exit 1; }
command -v debootstrap >/dev/null || { say "debootstrap is not installed (apt-get install debootstrap)"; exit 1; }
[ -f "$deb" ] || { say "no package at $deb"; exit 1; }
if ! python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15).read(1)" \
     "$mirror/dists/bookworm/InRelease" 2>/dev/null; then
  say "cannot reach $mirror (offline?)"
  exit 3
fi
mkdir -p "$cache/archives"
[ ! -d "$rootfs" ] || [ -z "$(ls -A "$rootfs")" ] || { say "$rootfs is not empty"; exit 1; }
mkdir -p "$rootfs"

t=$SECONDS
if [ -f "$base" ] && [ -n "$(find "$base" -mtime -7)" ]; then
  tar --numeric-owner -xpf "$base" -C "$rootfs"
  say "unpacked the cached debootstrap root ($base) in $((SECONDS - t)) s"
else
  staging=$(mktemp -d "$cache/debootstrap.XXXXXX")
  trap 'rm -rf "$staging"' EXIT
  if ! debootstrap --variant=minbase bookworm "$staging" "$mirror" >"$cache/debootstrap.log" 2>&1; then
    say "debootstrap failed (the last lines of $cache/debootstrap.log:)"
    tail -5 "$cache/debootstrap.log" >&2
    exit 1
  fi
  downloaded=$(du -sm "$staging/var/cache/apt/archives" | cut -f1)
  cp -n "$staging"/var/cache/apt/archives/*.deb "$cache/archives/" 2>/dev/null || true
  rm -f "$staging"/var/cache/apt/archives/*.deb
  tar --numeric-owner -cf "$base.tmp" -C "$staging" . && mv "$base.tmp" "$base"
  rm -rf "$staging"
  trap - EXIT
  tar --numeric-owner -xpf "$base" -C "$rootfs"
  say "debootstrap --variant=minbase bookworm from $mirror: $((SECONDS - t)) s, ${downloaded} MiB of packages downloaded"
fi

t=$SECONDS
# apt takes the packages it finds in its archive directory instead of downloading them.
cp "$cache"/archives/*.deb "$rootfs/var/cache/apt/archives/" 2>/dev/null || true
cp "$deb" "$rootfs/tmp/kvrail.deb"
before=$(find "$rootfs/var/cache/apt/archives" -maxdepth 1 -name '*.deb' | wc -l)
log=$(mktemp)
if ! chroot "$rootfs" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
       apt-get install -y -qq --no-install-recommends /tmp/kvrail.deb" >"$log" 2>&1; then
  say "apt install ./kvrail.deb failed:"
  tail -20 "$log" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
after=$(find "$rootfs/var/cache/apt/archives" -maxdepth 1 -name '*.deb' | wc -l)
cp -n "$rootfs"/var/cache/apt/archives/*.deb "$cache/archives/" 2>/dev/null || true
rm -rf "$rootfs/tmp/kvrail.deb" "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/var/cache/apt/*.bin
say "apt install ./$(basename "$deb") (with its Depends; $((after - before)) packages downloaded, the rest from the cache): $((SECONDS - t)) s"
