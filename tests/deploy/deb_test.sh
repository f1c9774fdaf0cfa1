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
check "control: package kvrail" 'echo "$info" | grep -q "^ Package: kvrail$"'
check "control: version 0.1.0" 'echo "$info" | grep -q "^ Version: 0.1.0$"'
check "control: depends on the runtime libraries (grpc, protobuf, libfabric, systemd)" \
  'echo "$info" | grep "^ Depends:" | grep -q "libgrpc++" && echo "$info" | grep "^ Depends:" | grep -q "libfabric1" && echo "$info" | grep "^ Depends:" | grep -q "libsystemd0"'
check "control: no -dev package in Depends" '! echo "$info" | grep "^ Depends:" | grep -q -- "-dev"'
check "control: the config is a conffile" 'dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/kvrail/kvraild.textproto'
got=$(dpkg-deb --contents "$deb" | awk '{print $6}' | sed 's#^\./#/#' | grep -v '/$' | sort)
want=$(sort "$dir/deploy/deb/files.txt")
check "contents: exactly deploy/deb/files.txt" '[ "$got" = "$want" ]'
[ "$got" = "$want" ] || diff <(echo "$want") <(echo "$got") || true
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg-deb -x "$deb" "$root"
check "binaries: mode 0755" '[ "$(stat -c %a "$root/usr/bin/kvraild")" = 755 ] && [ "$(stat -c %a "$root/usr/bin/kvrail")" = 755 ]'
check "kvraild --version names the version and build" '"$root/usr/bin/kvraild" --version | grep -q "^kvraild 0.1.0 ("'
check "kvrail --version names the version and build" '"$root/usr/bin/kvrail" --version | grep -q "^kvrail 0.1.0 ("'
check "man pages: kvraild(8) and kvrail(1) name their commands" \
  'zcat "$root/usr/share/man/man8/kvraild.8.gz" | grep -q "^\.TH KVRAILD \"8\"" && zcat "$root/usr/share/man/man1/kvrail.1.gz" | grep -q "^\.TH KVRAIL \"1\""'
check "man page: kvraild(8) documents --metrics-listen" 'zcat "$root/usr/share/man/man8/kvraild.8.gz" | grep -q "metrics.-listen"'
check "completion: completes kvrail's commands" \
  'bash -c "source \"$root/usr/share/bash-completion/completions/kvrail\"; COMP_WORDS=(kvrail tr); COMP_CWORD=1; _kvrail; [ \"\${COMPREPLY[*]}\" = transfers ]"'
check "unit: ExecStart names the installed binary" 'grep -q "^ExecStart=/usr/bin/kvraild " "$root/lib/systemd/system/kvraild.service"'
check "postinst: creates the kvrail system user" 'dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./postinst | grep -q "adduser --system"'
exit $fail
