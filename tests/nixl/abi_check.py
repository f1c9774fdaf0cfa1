"""Checks nixl_abi.h's facts against the installed nixl-cu13 wheel's own binaries, so an upgraded
wheel whose plugin ABI moved fails here instead of crashing an agent:
- the virtual method order of nixlBackendEngine (the wheel's libplugin_POSIX.so's vtable for
  nixlPosixEngine, each slot resolved to its symbol's name),
- libplugin_KVRAIL.so exporting only the entry points, and none of its undefined thread_local
  hooks being defined by the wheel's libraries (its linked-in gRPC must not bind to the wheel's).
Reads ELF files with binutils (readelf, nm); prints what differs and exits 1."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

# Slot i (after the offset-to-top and type_info words) holds this method of nixlBackendEngine, as
# nixl_abi.h declares it.
EXPECTED_SLOTS = [
    "~", "~", "supportsRemote", "supportsLocal", "supportsNotif", "getSupportedMems",
    "registerMem", "deregisterMem", "connect", "disconnect", "unloadMD", "prepXfer", "postXfer",
    "checkXfer", "releaseReqH", "prepMemView(nixlDescList<nixlRemoteMetaDesc>",
    "prepMemView(nixlDescList<nixlMetaDesc>", "releaseMemView", "getPublicData", "getConnInfo",
    "loadRemoteConnInfo", "loadRemoteMD", "loadLocalMD", "getNotifs", "genNotif", "queryMem",
    "estimateXferCost",
]


def run(*args: str) -> str:
    return subprocess.run(list(args), check=True, capture_output=True, text=True).stdout


def vtable_slots(lib: str, cls: str) -> list[str]:
    """The demangled method names in `cls`'s vtable (from its relocations)."""
    symbols: dict[int, str] = {}
    vtable_addr = None
    for line in run("nm", "-C", lib).splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0].strip():
            symbols.setdefault(int(parts[0], 16), parts[2])
            if parts[2] == f"vtable for {cls}":
                vtable_addr = int(parts[0], 16)
    if vtable_addr is None:
        raise RuntimeError(f"{lib}: no vtable for {cls}")
    relocs: dict[int, str] = {}
    for line in run("readelf", "-rW", lib).splitlines():
        f = line.split()
        if len(f) >= 4 and re.fullmatch(r"[0-9a-f]{16}", f[0]):
            if "RELATIVE" in f[2]:
                relocs[int(f[0], 16)] = symbols.get(int(f[3], 16), "?")
            elif len(f) >= 5:
                relocs[int(f[0], 16)] = " ".join(f[4:])
    demangled = {}
    slots = []
    for i in range(2, 2 + len(EXPECTED_SLOTS)):
        target = relocs.get(vtable_addr + 8 * i, "<none>")
        target = target.split(" + ")[0]
        if target.startswith("_Z"):
            target = demangled.setdefault(target, run("c++filt", target).strip())
        slots.append(target)
    return slots


def main() -> int:
    venv = os.environ.get("KVRAIL_VENV", "")
    libs = glob.glob(os.path.join(venv, "lib/python3*/site-packages/.nixl_cu13.mesonpy.libs"))
    if not libs:
        print(f"FAIL: no nixl-cu13 wheel in KVRAIL_VENV '{venv}'")
        return 1
    posix = os.path.join(libs[0], "plugins", "libplugin_POSIX.so")
    problems = []
    slots = vtable_slots(posix, "nixlPosixEngine")
    for i, (want, got) in enumerate(zip(EXPECTED_SLOTS, slots)):
        if want == "~":
            ok = "::~nixlPosixEngine()" in got
        else:
            ok = (f"::{want}(" in got) or (f"::{want}" in got and "(" in want)
        if not ok:
            problems.append(f"vtable slot {i + 2}: want {want}, the wheel has {got}")
    if len(slots) != len(EXPECTED_SLOTS):
        problems.append(f"{len(slots)} slots read, {len(EXPECTED_SLOTS)} expected")
    plugin = os.environ.get("KVRAIL_PLUGIN", "")
    if plugin:
        exported, weak_refs = [], []
        for line in run("readelf", "-W", "--dyn-syms", plugin).splitlines():
            f = line.split()
            if len(f) < 8 or not f[0].endswith(":"):
                continue
            if f[6] == "UND":
                if f[7].startswith("_ZTH"):  # thread_local init functions, bound by name
                    weak_refs.append(f[7].split("@")[0])
            elif f[4] in ("GLOBAL", "WEAK", "UNIQUE"):
                exported.append(f[7].split("@")[0])
        if sorted(exported) != ["nixl_plugin_fini", "nixl_plugin_init"]:
            problems.append(f"{plugin} exports {sorted(exported)}, want only the entry points")
        # gRPC's own thread_local init hooks stay undefined in the plugin (its gRPC defines none
        # of them); the wheel's gRPC must not define one the plugin would then call.
        wheel_defs = set()
        for lib in glob.glob(os.path.join(libs[0], "..", "nixl_cu13.libs", "*.so*")):
            wheel_defs.update(line.split()[-1] for line in
                              run("nm", "-D", "--defined-only", lib).splitlines())
        for ref in sorted(set(weak_refs) & wheel_defs):
            problems.append(f"{plugin} refers to {ref}, which the wheel's libraries define")
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"OK: {len(EXPECTED_SLOTS)} vtable slots of the wheel's engine match nixl_abi.h")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
