#!/bin/bash
# Builds kvrail_<version>_amd64.deb and its debug symbols, kvrail-dbgsym, from the Bazel outputs
# (//deploy:deb runs it):
#   build_deb.sh OUT.deb OUT-dbgsym.deb KVRAILD KVRAIL MAN8 MAN1 DEPLOY_DIR OPERATIONS_MD LIBKVRAIL PY_FILES...
# The binaries and libkvrail.so are installed stripped; their DWARF goes into the -dbgsym package
# under /usr/lib/debug/.build-id/ (where gdb finds it by the binary's build id), as Debian's
# dh_strip does. lintian (//tests/deploy:lintian_test) checks both packages.
# PY_FILES are the `kvrail` Python package's files (python/kvrail/**.py and the generated
# kvrail/proto/*_pb2.py), installed with LIBKVRAIL beside them in /usr/lib/python3/dist-packages
# (where the package looks for it first); python3 and python3-protobuf are Recommends, so an
# image installed with --no-install-recommends stays without Python.
# Depends: is computed from the libraries the binaries link (readelf NEEDED -> the Debian package
# that ships each, by dpkg -S), so it names exactly the runtime packages of this build machine's
# Debian 12.
set -euo pipefail
out=$1 dbgsym_out=$2 kvraild=$3 kvrail=$4 man8=$5 man1=$6 deploy=$7 ops=$8 libkvrail=$9
shift 9
version=$("$kvraild" --version | awk '{print $2}')
root=$(mktemp -d)
dbg=$(mktemp -d)
trap 'rm -rf "$root" "$dbg"' EXIT
install -D -m 0755 "$kvraild" "$root/usr/bin/kvraild"
install -D -m 0755 "$kvrail" "$root/usr/bin/kvrail"
install -D -m 0644 "$deploy/systemd/kvraild.service" "$root/lib/systemd/system/kvraild.service"
install -D -m 0644 "$deploy/config/kvraild.textproto" "$root/etc/kvrail/kvraild.textproto"
install -D -m 0644 "$man8" "$root/usr/share/man/man8/kvraild.8"
install -D -m 0644 "$man1" "$root/usr/share/man/man1/kvrail.1"
gzip -9n "$root/usr/share/man/man8/kvraild.8" "$root/usr/share/man/man1/kvrail.1"
install -D -m 0644 "$deploy/deb/kvrail.bash-completion" "$root/usr/share/bash-completion/completions/kvrail"
doc="$root/usr/share/doc/kvrail"
install -D -m 0644 "$ops" "$doc/operations.md"
install -D -m 0644 "$deploy/deb/copyright" "$doc/copyright"
install -D -m 0644 "$deploy/deb/changelog" "$doc/changelog"
gzip -9n "$doc/changelog"
install -D -m 0644 "$deploy/deb/lintian-overrides" "$root/usr/share/lintian/overrides/kvrail"
for f in k8s/base/kvraild-daemonset.yaml k8s/inference-pod-example.yaml monitoring/kvrail-alerts.yaml \
         monitoring/kvrail-dashboard.json systemd/nvidia-cuda-mps.service; do
  install -D -m 0644 "$deploy/$f" "$doc/examples/$(basename "$f")"
done
py="$root/usr/lib/python3/dist-packages/kvrail"
for f in "$@"; do
  install -D -m 0644 "$f" "$py/${f##*python/kvrail/}"
done
install -D -m 0644 "$libkvrail" "$py/libkvrail.so"
# Strip, keeping the debug information in the -dbgsym package by build id.
build_ids=()
for f in "$root/usr/bin/kvraild" "$root/usr/bin/kvrail" "$py/libkvrail.so"; do
  id=$(readelf -n "$f" | sed -n 's/.*Build ID: \([0-9a-f]*\).*/\1/p')
  [ -n "$id" ] || { echo "build_deb.sh: $f has no build id (link with --build-id)" >&2; exit 1; }
  debug="$dbg/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug"
  mkdir -p "$(dirname "$debug")"
  objcopy --only-keep-debug --compress-debug-sections "$f" "$debug"
  chmod 0644 "$debug"
  strip --remove-section=.comment --remove-section=.note --strip-unneeded "$f"
  objcopy --add-gnu-debuglink="$debug" "$f"
  build_ids+=("$id")
done
# Runtime dependencies from the binaries' NEEDED libraries. Readers that stop early (head, awk's exit) read a
# whole output here: under pipefail a producer killed by SIGPIPE would fail the build by chance.
first_owner() { local out; out=$(dpkg -S "$1" 2>/dev/null) || return 1; head -1 <<<"$out" | cut -d: -f1; }
libs=$(ldconfig -p)
deps=$( (readelf -d "$kvraild" "$kvrail" "$libkvrail" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p') | sort -u |
  while read -r lib; do
    path=$(awk -v l="$lib" '$1 == l && /x86-64/ && !found {print $NF; found = 1}' <<<"$libs")
    [ -n "$path" ] || continue
    first_owner "$(readlink -f "$path")" ||
      first_owner "$path"
  done | grep -v '^libcuda' | sort -u | paste -sd, | sed 's/,/, /g')
mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CONTROL
Package: kvrail
Version: $version
Architecture: amd64
Maintainer: kvrail developers <kvrail-dev@example.org>
Section: net
Priority: optional
Depends: adduser, ${deps}
Recommends: bash-completion, python3, python3-protobuf
Description: KV-cache transfer daemon for disaggregated LLM serving
 kvraild moves LLM KV cache between GPU and host regions of inference
 processes on a node and across nodes (libfabric); kvrail is its operator
 CLI; the kvrail Python module is its client library for inference servers.
 Its GPU kernels run on compute capability 8.0 and newer (A100, L4/L40,
 H100/H200, B200). The systemd unit is installed but not enabled.
CONTROL
echo /etc/kvrail/kvraild.textproto > "$root/DEBIAN/conffiles"
install -m 0755 "$deploy/deb/postinst" "$root/DEBIAN/postinst"
install -m 0755 "$deploy/deb/prerm" "$root/DEBIAN/prerm"
install -m 0755 "$deploy/deb/postrm" "$root/DEBIAN/postrm"
md5sums() { (cd "$1" && find . -type f ! -path ./DEBIAN/\* -printf '%P\n' | LC_ALL=C sort | xargs md5sum); }
md5sums "$root" > "$root/DEBIAN/md5sums"
dpkg-deb --root-owner-group -Zxz --build "$root" "$out" >/dev/null

# kvrail-dbgsym: the DWARF of this exact build (Depends pins the version).
mkdir -p "$dbg/usr/share/doc" "$dbg/DEBIAN"
ln -s kvrail "$dbg/usr/share/doc/kvrail-dbgsym"
cat > "$dbg/DEBIAN/control" <<CONTROL
Package: kvrail-dbgsym
Source: kvrail
Version: $version
Architecture: amd64
Maintainer: kvrail developers <kvrail-dev@example.org>
Section: debug
Priority: optional
Depends: kvrail (= $version)
Auto-Built-Package: debug-symbols
Build-Ids: ${build_ids[*]}
Description: debug symbols for kvrail
 The DWARF debug information of kvraild, kvrail and libkvrail.so, found by
 gdb through the binaries' build ids.
CONTROL
md5sums "$dbg" > "$dbg/DEBIAN/md5sums"
dpkg-deb --root-owner-group -Zxz --build "$dbg" "$dbgsym_out" >/dev/null
