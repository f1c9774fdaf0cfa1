#!/bin/bash
# The .deb installed as an operator would (`apt install ./kvrail_*.deb`) into a minimal
# Debian 12 root file system (deploy/container/make_rootfs.sh: debootstrap bookworm minbase,
# cached in ~/.cache/kvrail-rootfs), checked inside it with chroot; then the container image
# built from that root file system (deploy/container/build_oci.py, an OCI image layout) and
# checked structurally (tests/deploy/check_oci.py; `umoci` and `skopeo` where installed).
#
# Needs root and Debian's mirror: otherwise it prints "SKIPPED (...)" and passes, saying so.
# Tagged local + requires-network (no sandbox: chroot, the cache, the network).
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
deb="$dir/deploy/kvrail_amd64.deb"
start=$SECONDS
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED (not root: debootstrap and chroot need root; CI runs as root). Nothing was checked."
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  echo "FAIL debootstrap is not installed (deploy/dev.sh's PACKAGES has it)"
  exit 1
fi
work=$(mktemp -d /tmp/kvrail-deb-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
root="$work/root"
fail=0
# Checks read pipelines' last command (grep -q ends early: no pipefail there).
check() { if (set +o pipefail; eval "$2"); then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
in_root() { chroot "$root" "$@"; }

set +e
"$dir/deploy/container/make_rootfs.sh" "$root" "$deb"
rc=$?
set -e
if [ $rc -eq 3 ]; then
  echo "SKIPPED (Debian's mirror cannot be reached: offline). Nothing was checked."
  exit 0
fi
[ $rc -eq 0 ] || { echo "FAIL make_rootfs.sh (exit $rc)"; exit 1; }
install_s=$((SECONDS - start))

version=$(dpkg-deb -f "$deb" Version)
check "dpkg: kvrail $version is installed" \
  '[ "$(in_root dpkg-query -W -f="\${Status} \${Version}" kvrail)" = "install ok installed $version" ]'
while read -r f; do
  [ -n "$f" ] || continue
  check "file: $f" '[ -f "$root$f" ]'
done < "$dir/deploy/deb/files.txt"
check "conffile: /etc/kvrail/kvraild.textproto is registered as one" \
  'grep -q "/etc/kvrail/kvraild.textproto" <<<"$(in_root dpkg-query -W -f="\${Conffiles}" kvrail)"'
# The Python module: the root has no python3 (a Recommends; installed without them, as the
# image is), so Debian's python3 of this machine imports the root's copy and loads its library.
check "python package: the installed kvrail module imports and loads its libkvrail.so" \
  'PYTHONPATH="$root/usr/lib/python3/dist-packages" /usr/bin/python3 -s -c "
import kvrail, sys
from kvrail import _lib
assert kvrail.__file__.startswith(sys.argv[1]), kvrail.__file__
assert _lib.lib().kvrail_abi_version() == _lib.ABI_VERSION
" "$root"'
check "kvraild --version runs inside the root" 'grep -q "^kvraild $version (" <<<"$(in_root /usr/bin/kvraild --version)"'
check "kvrail --version runs inside the root" 'grep -q "^kvrail $version (" <<<"$(in_root /usr/bin/kvrail --version)"'
check "no library missing (ldd inside the root)" \
  '! grep -q "not found" <<<"$(in_root /usr/bin/ldd /usr/bin/kvraild /usr/bin/kvrail /usr/lib/python3/dist-packages/kvrail/libkvrail.so)"'
check "kvraild validates the installed default config" \
  'grep -q "unix_socket: cannot open lock file /nonexistent/k.sock.lock" \
     <<<"$(in_root /usr/bin/kvraild --config /etc/kvrail/kvraild.textproto --socket /nonexistent/k.sock 2>&1)"'
check "postinst: the kvrail system group exists (gid 990 in a fresh root)" \
  '[ "$(in_root getent group kvrail | cut -d: -f3)" = 990 ]'
check "postinst: the kvrail system user, in group kvrail, no login, uid 990" \
  'IFS=: read -r _ _ uid gid _ home shell <<<"$(in_root getent passwd kvrail)";
   [ "$uid" = 990 ] && [ "$gid" = 990 ] && [ "$home" = /nonexistent ] && [ "$shell" = /usr/sbin/nologin ]'
check "man pages: man-db would find kvraild(8) and kvrail(1)" \
  '[ -f "$root/usr/share/man/man8/kvraild.8.gz" ] && grep -q "^\.TH KVRAIL" <<<"$(zcat "$root/usr/share/man/man1/kvrail.1.gz")"'
check "completion: the installed script completes kvrail's commands" \
  'bash -c "source \"$root/usr/share/bash-completion/completions/kvrail\"; COMP_WORDS=(kvrail tr); COMP_CWORD=1; _kvrail; [ \"\${COMPREPLY[*]}\" = transfers ]"'
if command -v systemd-analyze >/dev/null; then
  # The installed unit, with ExecStart pointing into the root and the root's man pages.
  unit="$work/kvraild.service"
  sed "s#/usr/bin/kvraild#$root/usr/bin/kvraild#g" "$root/lib/systemd/system/kvraild.service" > "$unit"
  out=$(MANPATH="$root/usr/share/man" systemd-analyze verify "$unit" 2>&1 | grep kvraild.service || true)
  [ -z "$out" ] || echo "$out" | sed 's/^/     systemd-analyze: /'
  check "unit: systemd-analyze verify of the installed unit reports nothing" '[ -z "$out" ]'
else
  echo "skip systemd-analyze verify (systemd-analyze not installed)"
fi
checks_s=$((SECONDS - start - install_s))

# The image: the same root, as an OCI image layout; built twice to show it is deterministic.
t=$SECONDS
revision=0123456789abcdef0123456789abcdef01234567  # build.sh passes `git rev-parse HEAD`
for n in 1 2; do
  SOURCE_DATE_EPOCH=1764547200 python3 "$dir/deploy/container/build_oci.py" --rootfs "$root" \
    --out "$work/oci$n" --version "$version" --revision "$revision" \
    --source "https://kvrail.invalid/source" >/dev/null
done
image_s=$((SECONDS - t))
check "image: built twice from one root, the same index.json (digests)" \
  'cmp -s "$work/oci1/index.json" "$work/oci2/index.json"'
rm -rf "$work/oci2"
sed 's#^#/#; s#^//#/#' "$dir/deploy/deb/files.txt" > "$work/files"
check "image: the layout validates (tests/deploy/check_oci.py)" \
  'python3 "$dir/tests/deploy/check_oci.py" "$work/oci1" --version "$version" --revision "$revision" \
     --files "$work/files" > "$work/check_oci.log"'
grep -v '^ok ' "$work/check_oci.log" || true
if command -v umoci >/dev/null; then
  check "umoci: stat reads the tagged image (manifest, config)" \
    'umoci stat --image "$work/oci1:$version" >/dev/null 2>"$work/umoci.err" || { cat "$work/umoci.err"; false; }'
else
  echo "skip umoci (not installed)"
fi
if command -v skopeo >/dev/null; then
  check "skopeo: inspect shows the version label, the entrypoint and the user" \
    'skopeo inspect "oci:$work/oci1:$version" > "$work/inspect.json" &&
     skopeo inspect --config "oci:$work/oci1:$version" > "$work/config.json" &&
     python3 - "$work" "$version" <<"PY"
import json, sys
inspect = json.load(open(sys.argv[1] + "/inspect.json"))
config = json.load(open(sys.argv[1] + "/config.json"))["config"]
assert inspect["Labels"]["org.opencontainers.image.version"] == sys.argv[2], inspect["Labels"]
assert config["Entrypoint"][0] == "/usr/bin/kvraild", config
assert config["User"] == "990:990", config
PY'
else
  echo "skip skopeo (not installed)"
fi
layer_mib=$(du -sm "$work/oci1/blobs" | cut -f1)
echo "times: root file system + apt install ${install_s} s, checks ${checks_s} s, image (built twice, ${layer_mib} MiB) ${image_s} s, total $((SECONDS - start)) s"
exit $fail
