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
check "postinst: creates the kvrail system user" 'grep -q "adduser --system" <<<"$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./postinst)"'
exit $fail
