#!/bin/bash
# deploy/container/build_oci.py and tests/deploy/check_oci.py on a small made-up root file system
# (no root, no network; deb_install_test does the real one): the same root gives the same
# digests whatever its files' times; the layout validates; a flipped layer byte, a wrong tag, a
# layer without the entrypoint and a missing kvrail user are each caught.
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
build="$dir/deploy/container/build_oci.py"
checker="$dir/tests/deploy/check_oci.py"
tmp=$(mktemp -d /tmp/kvrail-oci.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

root="$tmp/root"
mkdir -p "$root/usr/bin" "$root/etc/kvrail" "$root/dev" "$root/proc" "$root/tmp" \
  "$root/var/lib/apt/lists" "$root/run"
printf '#!/bin/sh\necho kvraild 0.1.0\n' > "$root/usr/bin/kvraild"
chmod 0755 "$root/usr/bin/kvraild"
ln "$root/usr/bin/kvraild" "$root/usr/bin/kvraild-hardlink"
ln -s usr/bin "$root/bin"
echo 'socket_mode: 432' > "$root/etc/kvrail/kvraild.textproto"
printf 'root:x:0:0:root:/root:/bin/sh\nkvrail:x:990:990::/nonexistent:/usr/sbin/nologin\n' > "$root/etc/passwd"
echo junk > "$root/tmp/left-out"
echo junk > "$root/var/lib/apt/lists/left-out"
mkfifo "$root/run/fifo"
# The layer blob's path in layout $1 (through index.json and the manifest).
layer_of() {
  python3 - "$1" <<"PY"
import json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "index.json")))["manifests"][0]["digest"].split(":")[1]
man = json.load(open(os.path.join(d, "blobs/sha256", m)))
print(os.path.join(d, "blobs/sha256", man["layers"][0]["digest"].split(":")[1]))
PY
}
build_into() {
  python3 "$build" --rootfs "$root" --out "$1" --version 0.1.0 --revision abc123 \
    --source https://kvrail.invalid/source "${@:2}" > /dev/null
}

build_into "$tmp/a"
touch -d '2001-01-01' "$root/usr/bin/kvraild" "$root/etc/kvrail/kvraild.textproto" "$root/usr/bin"
build_into "$tmp/b"
check "deterministic: other mtimes, the same index.json and blobs" \
  'cmp -s "$tmp/a/index.json" "$tmp/b/index.json" && diff -r "$tmp/a" "$tmp/b" >/dev/null'
check "the layout validates" 'python3 "$checker" "$tmp/a" --version 0.1.0 --revision abc123 >"$tmp/log"'
check "the layer holds usr/bin/kvraild, the bin symlink, tmp/ empty; not /tmp's or apt's lists' files, not the fifo" \
  'names=$(tar -tzf "$(layer_of "$tmp/a")");
   grep -qx usr/bin/kvraild <<<"$names" && grep -qx bin <<<"$names" && grep -qx tmp/ <<<"$names" &&
   ! grep -q "left-out" <<<"$names" && ! grep -q fifo <<<"$names"'
check "the hard link is a link entry, not a second copy" \
  'grep -q "kvraild-hardlink link to usr/bin/kvraild" <<<"$(tar -tvzf "$(layer_of "$tmp/a")")"'
check "entries carry the fixed time and numeric owners only" \
  'SOURCE_DATE_EPOCH=86400 build_into "$tmp/c" && python3 - "$tmp/c" <<"PY"
import json, os, sys, tarfile
d = sys.argv[1]
m = json.load(open(os.path.join(d, "index.json")))["manifests"][0]["digest"].split(":")[1]
man = json.load(open(os.path.join(d, "blobs/sha256", m)))
layer = os.path.join(d, "blobs/sha256", man["layers"][0]["digest"].split(":")[1])
with tarfile.open(layer) as t:
    assert all(x.mtime == 86400 and x.uname == "" and x.gname == "" for x in t), "times/owners"
cfg = json.load(open(os.path.join(d, "blobs/sha256", man["config"]["digest"].split(":")[1])))
assert cfg["created"] == "1970-01-02T00:00:00Z", cfg["created"]
assert cfg["config"]["User"] == "990:990", cfg["config"]["User"]
PY'

# Each of these must be caught.
cp -r "$tmp/a" "$tmp/bad"
python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=1; open(p,'wb').write(b)" \
  "$(layer_of "$tmp/bad")"
check "a flipped layer byte fails the check" \
  '! python3 "$checker" "$tmp/bad" --version 0.1.0 >"$tmp/log" && grep -q "FAIL layer 0: content has digest" "$tmp/log"'
check "a wrong version fails the check" \
  '! python3 "$checker" "$tmp/a" --version 0.2.0 >"$tmp/log" && grep -q "FAIL config: label org.opencontainers.image.version" "$tmp/log"'
check "a file the package installs but the layer lacks fails the check" \
  'echo /usr/share/man/man8/kvraild.8.gz > "$tmp/files"; ! python3 "$checker" "$tmp/a" --version 0.1.0 --files "$tmp/files" >"$tmp/log" &&
   grep -q "FAIL layer: /usr/share/man/man8/kvraild.8.gz" "$tmp/log"'
sed -i '/^kvrail:/d' "$root/etc/passwd"
check "no kvrail user: build_oci.py refuses" '! build_into "$tmp/d" 2>"$tmp/err" && grep -q "no kvrail user" "$tmp/err"'
rm "$root/usr/bin/kvraild" "$root/usr/bin/kvraild-hardlink"
check "no entrypoint: build_oci.py refuses" '! build_into "$tmp/e" 2>"$tmp/err" && grep -q "/usr/bin/kvraild is missing" "$tmp/err"'
exit $fail
