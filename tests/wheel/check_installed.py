"""Checks the kvrail package installed from the wheel into the venv running this script.

  python check_installed.py        (the venv's interpreter; prints facts, exits 1 on a failure)

- `import kvrail` comes from this venv, and the library it loads is the venv's
  kvrail/libkvrail.so (not $KVRAIL_LIB, not a system copy);
- what loading the library maps into the process (/proc/self/maps, before and after) is the
  wheel's own files or glibc-class system libraries: no Debian gRPC, protobuf, Abseil, OpenSSL;
- `ldd` of the installed library resolves every dependency, each to the wheel's kvrail.libs/ or a
  glibc-class library (the same list for any process);
- the library exports only the C ABI (kvrail_*);
- the glibc floor: the highest GLIBC_2.N symbol version the wheel's ELF files reference, printed
  as "glibc floor: 2.N" for the caller to compare with auditwheel's tag.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

# glibc's libraries, the C++ runtime and libgcc_s: every manylinux system has them.
GLIBC_CLASS = {
    "linux-vdso.so.1", "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
    "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1",
}

failures: list = []


def fail(message: str) -> None:
    failures.append(message)
    print("FAIL: " + message)


def mapped_files() -> set:
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/"):
                paths.add(fields[5].strip())
    return paths


def glibc_class(path: str) -> bool:
    """libstdc++.so.6 maps as libstdc++.so.6.0.30: the soname or a longer version of it."""
    base = os.path.basename(path)
    return any(base == name or base.startswith(name + ".") for name in GLIBC_CLASS)


def inside(path: str, folder: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(folder) + os.sep)


def run(argv: list) -> str:
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        fail(f"{' '.join(argv)} exited {done.returncode}: {done.stdout}")
    return done.stdout


def main() -> int:
    if os.environ.get("KVRAIL_LIB"):
        fail("KVRAIL_LIB is set: the check must load the installed library")
    import kvrail  # noqa: E402 (after the environment check); imports numpy and protobuf
    from kvrail import _lib

    package = os.path.dirname(os.path.abspath(kvrail.__file__))
    site = os.path.dirname(package)
    libs = os.path.join(site, "kvrail.libs")
    library = os.path.join(package, "libkvrail.so")
    print(f"python {sys.version.split()[0]} ({sys.executable}), prefix {sys.prefix}")
    if not inside(package, sys.prefix):
        fail(f"kvrail imported from {package}, outside the venv {sys.prefix}")
    if sys.prefix == sys.base_prefix:
        fail("not running in a venv")
    if not os.path.isfile(library):
        fail(f"{library}: not installed")
    if not os.path.isdir(libs):
        fail(f"{libs}: no vendored libraries installed")

    # gRPC and its TLS/DNS/zlib are linked into libkvrail.so (//client/c_api:wheel/libkvrail.so),
    # hidden behind its exports: a vendored copy would mean the wheel was built from the library
    # that links Debian's shared gRPC.
    static = re.compile(r"^lib(grpc|gpr|upb|ssl|crypto|cares|address_sorting)\b")
    vendored = sorted(os.listdir(libs)) if os.path.isdir(libs) else []
    shared_grpc = [n for n in vendored if static.match(n)]
    if shared_grpc:
        fail(f"kvrail.libs/ carries {shared_grpc}: gRPC/OpenSSL should be inside libkvrail.so")
    print(f"kvrail.libs/: {len(vendored)} libraries (" +
          ", ".join(sorted({re.sub(r"-[0-9a-f]{8}\.so.*", "", n) for n in vendored})) + ")")

    before = mapped_files()
    version = _lib.lib().kvrail_abi_version()
    after = mapped_files()
    print(f"libkvrail ABI {version}")
    loaded = [p for p in after if os.path.basename(p) == "libkvrail.so"]
    if [os.path.realpath(p) for p in loaded] != [os.path.realpath(library)]:
        fail(f"the process mapped {loaded}, not only {library}")
    for path in sorted(after - before):
        if inside(path, package) or inside(path, libs):
            continue
        if glibc_class(path):
            continue
        fail(f"loading libkvrail.so mapped {path}, neither the wheel's nor glibc-class")
    print(f"loading mapped {len(after - before)} new files, from the system: " +
          (", ".join(sorted(os.path.basename(p) for p in after - before
                            if not inside(p, site))) or "none"))

    resolved = 0
    for line in run(["ldd", library]).splitlines():
        line = line.strip()
        if not line or line.startswith("statically linked"):
            continue
        name = line.split()[0]
        target = line.split("=>", 1)[1].split("(")[0].strip() if "=>" in line else name
        if "not found" in line:
            fail(f"ldd: {name} not found")
        elif target and inside(target, libs):
            resolved += 1
        elif not glibc_class(name):
            fail(f"ldd: {name} => {target}: neither in kvrail.libs/ nor glibc-class")
        else:
            print(f"ldd: system {os.path.basename(name)}")
    print(f"ldd: {resolved} libraries from kvrail.libs/")

    exported = []
    for line in run(["nm", "-D", "--defined-only", library]).splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1].isupper():  # lower case: local (gold's TLS entries)
            exported.append(fields[2])
    others = [s for s in exported if not (s.startswith("kvrail_") or s == "KVRAIL_1")]
    if others:
        fail(f"libkvrail.so exports symbols outside the C ABI: {others[:10]}")
    if "kvrail_connect@@KVRAIL_1" not in exported:
        fail("libkvrail.so does not export kvrail_connect@@KVRAIL_1")
    print(f"exports: {len(exported)} symbols, all kvrail_*")

    floor = (2, 0)
    elfs = [library] + [os.path.join(libs, n) for n in sorted(os.listdir(libs))]
    for elf in elfs:
        for match in re.finditer(r"GLIBC_2\.(\d+)(?:\.(\d+))?", run(["objdump", "-T", elf])):
            floor = max(floor, (2, int(match.group(1))))
    print(f"glibc floor: {floor[0]}.{floor[1]}")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
