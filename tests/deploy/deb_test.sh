#!/bin/bash
# The Debian package (//deploy:deb): control fields, its file list (deploy/deb/files.txt), and
# an extraction into an empty root file system whose binaries run (`kvraild --version`,
# `kvrail --help`), whose unit verifies and whose man pages and completion are in place.
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE"
deb="$dir/deploy/kvrail_amd64.deb"
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
info=$(dpkg-deb --info "$deb")
check "control: package kvrail" 'grep -q "^ Package: kvrail$" <<<"$info"'
check "control: version 0.1.0" 'grep -q "^ Version: 0.1.0$" <<<"$info"'
check "control: depends on the runtime libraries (grpc, protobuf, libfabric, systemd)" \
  'depends=$(grep "^ Depends:" <<<"$info"); grep -q "libgrpc++" <<<"$depends" && grep -q "libfabric1" <<<"$depends" &&
   grep -q "libsystemd0" <<<"$depends"'
check "control: no -dev package in Depends" '! grep -q -- "-dev" <<<"$(grep "^ Depends:" <<<"$info")"'
check "control: the config is a conffile" 'grep -qx /etc/kvrail/kvraild.textproto <<<"$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)"'
got=$(dpkg-deb --contents "$deb" | awk '{print $6}' | sed 's#^\./#/#' | grep -v '/$' | sort)
want=$(sort "$dir/deploy/deb/files.txt")
check "contents: exactly deploy/deb/files.txt" '[ "$got" = "$want" ]'
[ "$got" = "$want" ] || diff <(echo "$want") <(echo "$got") || true
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg-deb -x "$deb" "$root"
check "binaries: mode 0755" '[ "$(stat -c %a "$root/usr/bin/kvraild")" = 755 ] && [ "$(stat -c %a "$root/usr/bin/kvrail")" = 755 ]'
check "kvraild --version names the version and build" 'grep -q "^kvraild 0.1.0 (" <<<"$("$root/usr/bin/kvraild" --version)"'
check "kvrail --version names the version and build" 'grep -q "^kvrail 0.1.0 (" <<<"$("$root/usr/bin/kvrail" --version)"'
check "man pages: kvraild(8) and kvrail(1) name their commands" \
  'grep -q "^\.TH KVRAILD \"8\"" <<<"$(zcat "$root/usr/share/man/man8/kvraild.8.gz")" &&
   grep -q "^\.TH KVRAIL \"1\"" <<<"$(zcat "$root/usr/share/man/man1/kvrail.1.gz")"'
check "man page: kvraild(8) documents --metrics-listen" 'grep -q "metrics.-listen" <<<"$(zcat "$root/usr/share/man/man8/kvraild.8.gz")"'
check "completion: completes kvrail's commands" \
  'bash -c "source \"$root/usr/share/bash-completion/completions/kvrail\"; COMP_WORDS=(kvrail tr); COMP_CWORD=1; _kvrail; [ \"\${COMPREPLY[*]}\" = transfers ]"'
check "unit: ExecStart names the installed binary" 'grep -q "^ExecStart=/usr/bin/kvraild " "$root/lib/systemd/system/kvraild.service"'
check "unit: CUDA's JIT cache in the unit's CacheDirectory" \
  'grep -qx "CacheDirectory=kvrail" "$root/lib/systemd/system/kvraild.service" &&
   grep -qx "Environment=CUDA_CACHE_PATH=/var/cache/kvrail/cuda-jit" "$root/lib/systemd/system/kvraild.service"'
check "binaries: stripped (no .symtab), with a debug link" \
  '(for b in usr/bin/kvraild usr/bin/kvrail usr/lib/python3/dist-packages/kvrail/libkvrail.so; do
     s=$(readelf -S -W "$root/$b"); ! grep -q "\.symtab" <<<"$s" && grep -q "\.gnu_debuglink" <<<"$s" || exit 1; done)'
check "control: md5sums cover every file" \
  '[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./md5sums | wc -l)" = "$(grep -c . "$dir/deploy/deb/files.txt")" ] &&
   (cd "$root" && dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./md5sums | md5sum --quiet -c -)'
check "postrm: a purge removes the JIT cache" 'grep -q "rm -rf /var/cache/kvrail" <<<"$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./postrm)"'
check "changelog: names this version" 'grep -q "^kvrail (0.1.0) " <<<"$(zcat "$root/usr/share/doc/kvrail/changelog.gz")"'
dbgsym="$dir/deploy/kvrail-dbgsym_amd64.deb"
dbg_info=$(dpkg-deb --info "$dbgsym")
check "dbgsym: depends on this exact kvrail" 'grep -q "^ Depends: kvrail (= 0.1.0)$" <<<"$dbg_info"'
check "dbgsym: one .debug file per binary, named by its build id" \
  '(for b in usr/bin/kvraild usr/bin/kvrail usr/lib/python3/dist-packages/kvrail/libkvrail.so; do
     id=$(readelf -n "$root/$b" | sed -n "s/.*Build ID: \([0-9a-f]*\).*/\1/p")
     grep -q "^\./usr/lib/debug/\.build-id/${id:0:2}/${id:2}\.debug$" <<<"$(dpkg-deb --fsys-tarfile "$dbgsym" | tar -t)" || exit 1
     grep -qw "$id" <<<"$(grep "^ Build-Ids:" <<<"$dbg_info")" || exit 1; done)'
check "postinst: creates the kvrail system user" 'grep -q "adduser --system" <<<"$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./postinst)"'
exit $fail
