"""The GPU code a CUDA program carries: every fatbin in its ELF .nv_fatbin section, listed.

No cuobjdump on the build machine, so the fatbin container is read directly: a fatbin is a
16-byte header (magic 0xBA55ED50, version u16, header size u16, payload size u64) followed by
entries, each with its own header (kind u16: 1 PTX, 2 ELF/SASS; version u16; header size u32;
payload size u64; ...; the architecture as a u32 at offset 28, e.g. 80, 89, 90) and payload.

    fatbin_arches.py PROGRAM [--elf 80,89,90] [--ptx 90]

prints one line per fatbin ("elf sm_80 sm_89 sm_90 | ptx compute_90"); with --elf / --ptx it
exits 1 unless every fatbin that holds code carries SASS for each --elf architecture and PTX for
each --ptx one (a library built for fewer architectures would fail on the GPUs left out).
"""

import argparse
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_ELF = 2


def sections(data: bytes, name: str) -> list[bytes]:
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    found = []
    for sh_name, sh_type, _, _, off, size in heads:
        end = data.index(b"\0", strtab + sh_name)
        if data[strtab + sh_name:end].decode() == name and sh_type != 8:  # 8: SHT_NOBITS
            found.append(data[off:off + size])
    return found


def fatbins(blob: bytes) -> list[tuple[set[int], set[int]]]:
    """(ELF architectures, PTX architectures) of each fatbin in a .nv_fatbin section."""
    out = []
    p = 0
    while p + 16 <= len(blob):
        magic, _, header, size = struct.unpack_from("<IHHQ", blob, p)
        if magic != FATBIN_MAGIC:
            p += 8  # fatbins are 8-byte aligned in the section
            continue
        elf, ptx = set(), set()
        q, end = p + header, p + header + size
        while q + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", blob, q)
            arch = struct.unpack_from("<I", blob, q + 28)[0]
            if kind == KIND_ELF:
                elf.add(arch)
            elif kind == KIND_PTX:
                ptx.add(arch)
            if entry_header == 0:
                raise ValueError(f"fatbin entry at {q} has an empty header")
            q += entry_header + payload
        out.append((elf, ptx))
        p = end
    return out


def arch_list(text: str) -> set[int]:
    return {int(a) for a in text.split(",") if a}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program")
    ap.add_argument("--elf", type=arch_list, default=set())
    ap.add_argument("--ptx", type=arch_list, default=set())
    args = ap.parse_args()
    with open(args.program, "rb") as f:
        data = f.read()
    found = [fb for s in sections(data, ".nv_fatbin") for fb in fatbins(s)]
    if not found:
        print(f"{args.program}: no fatbin")
        return 1 if args.elf or args.ptx else 0
    bad = 0
    for elf, ptx in found:
        line = ("elf " + " ".join(f"sm_{a}" for a in sorted(elf)) + " | ptx " +
                " ".join(f"compute_{a}" for a in sorted(ptx)))
        missing = sorted(args.elf - elf) + sorted(args.ptx - ptx)
        # Host-only CUDA code (no kernels) yields a fatbin with no entries: nothing to check.
        if (elf or ptx) and missing:
            line += "  MISSING " + " ".join(str(a) for a in missing)
            bad = 1
        print(line)
    return bad


if __name__ == "__main__":
    sys.exit(main())
