"""Finding the shareable file behind an engine's own host memory, so kvraild can map the same
pages (Client.register_host_array): a numpy array or torch CPU tensor whose memory is a MAP_SHARED
mapping of a memfd or a /dev/shm object (torch's share_memory_(), multiprocessing.shared_memory,
an mmap of a /dev/shm file or a memfd, a kvrail HostBuffer).

The mapping is read from /proc/self/maps; a descriptor of its file is found, in this order, among
the process's open descriptors (/proc/self/fd, matched by device and inode: torch and memfd
users keep theirs), through /proc/self/map_files (needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE),
or by the mapping's path when the file still has one (checked to be the same inode).
Anonymous or private memory (numpy.zeros, a tensor before share_memory_(), MAP_PRIVATE) cannot be
shared without a copy and is refused with an error naming the argument.

Linux only; pure Python (no torch or numpy import here).
"""
from __future__ import annotations

import dataclasses
import os
from typing import List, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class MapEntry:
    """One line of /proc/self/maps."""

    start: int
    end: int
    perms: str  # "rw-s"
    offset: int  # file offset of `start`
    dev: int  # os.makedev(major, minor)
    inode: int
    path: str  # "" for anonymous memory; "/dev/shm/x (deleted)" for an unlinked file

    @property
    def shared(self) -> bool:
        return self.perms[3:4] == "s"


def parse_maps(text: str) -> List[MapEntry]:
    """The entries of a /proc/PID/maps text."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        out.append(MapEntry(start, end, parts[1], int(parts[2], 16), os.makedev(major, minor),
                            int(parts[4]), parts[5].strip() if len(parts) > 5 else ""))
    return out


@dataclasses.dataclass(frozen=True)
class Backing:
    """The file behind [address, address + nbytes): `fd` (a new descriptor the caller closes) at
    file offset `offset`; `path` as /proc/self/maps names it."""

    fd: int
    offset: int
    path: str


def _describe(address: int, nbytes: int) -> str:
    return f"[0x{address:x}, 0x{address + nbytes:x})"


def _covering(entries: List[MapEntry], address: int, nbytes: int, arg: str) -> MapEntry:
    """The mapping holding the whole range (adjacent entries of one file at consecutive offsets
    are merged: the kernel splits a mapping when part of it changes protection)."""
    end = address + nbytes
    first = next((e for e in entries if e.start <= address < e.end), None)
    if first is None:
        raise ValueError(f"{arg}: {_describe(address, nbytes)} is not mapped in this process")
    merged = first
    index = entries.index(first)
    while merged.end < end:
        index += 1
        nxt = entries[index] if index < len(entries) else None
        if (nxt is None or nxt.start != merged.end or nxt.inode != merged.inode or
                nxt.dev != merged.dev or nxt.perms != merged.perms or
                nxt.offset != merged.offset + (merged.end - merged.start)):
            raise ValueError(f"{arg}: {_describe(address, nbytes)} spans more than one mapping "
                             f"(the first is {merged.path or 'anonymous memory'}); register "
                             "memory of one shared file")
        merged = dataclasses.replace(merged, end=nxt.end)
    return merged


def _same_file(fd: int, entry: MapEntry) -> bool:
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return st.st_ino == entry.inode and st.st_dev == entry.dev


def _open_checked(path: str, entry: MapEntry, writable: bool) -> Optional[int]:
    """`path` opened (read-write when `writable`), if it is the mapping's file; else None."""
    try:
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    except OSError:
        return None
    if _same_file(fd, entry):
        return fd
    os.close(fd)
    return None


def _from_open_fds(entry: MapEntry, writable: bool) -> Optional[int]:
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        link = f"/proc/self/fd/{name}"
        try:
            st = os.stat(link)  # the file the descriptor refers to (also when unlinked)
        except OSError:
            continue
        if st.st_ino != entry.inode or st.st_dev != entry.dev:
            continue
        # Opening the /proc link gives a descriptor of its own with the access asked for (a
        # memfd or tmpfs file reopens, also when unlinked); else a duplicate of the same one.
        fd = _open_checked(link, entry, writable)
        if fd is not None:
            return fd
        try:
            return os.dup(int(name))
        except OSError:
            continue
    return None


def find_backing(address: int, nbytes: int, *, writable: bool = False, arg: str = "obj",
                 maps_text: Optional[str] = None) -> Backing:
    """The shareable file behind [address, address + nbytes) of this process; ValueError naming
    `arg` when there is none (anonymous or private memory) or no descriptor of it can be had."""
    if nbytes <= 0:
        raise ValueError(f"{arg}: no bytes to register")
    if maps_text is None:
        with open("/proc/self/maps") as f:
            maps_text = f.read()
    entry = _covering(parse_maps(maps_text), address, nbytes, arg)
    where = _describe(address, nbytes)
    if entry.inode == 0 or not entry.path or entry.path.startswith("["):
        raise ValueError(
            f"{arg}: its memory {where} is anonymous ({entry.path or 'no file'}), so kvraild "
            "cannot map the same pages; allocate it in shared memory: torch's "
            "tensor.share_memory_(), numpy over multiprocessing.shared_memory or an mmap of a "
            "memfd or /dev/shm file, or a kvrail HostBuffer")
    if not entry.shared:
        raise ValueError(
            f"{arg}: its memory {where} is a private (copy-on-write) mapping of {entry.path}, so "
            "kvraild would not see this process's writes; map the file MAP_SHARED")
    offset = entry.offset + (address - entry.start)
    fd = _from_open_fds(entry, writable)
    if fd is None:
        fd = _open_checked(f"/proc/self/map_files/{entry.start:x}-{entry.end:x}", entry, writable)
    if fd is None and not entry.path.endswith(" (deleted)"):
        fd = _open_checked(entry.path, entry, writable)
    if fd is None:
        raise ValueError(
            f"{arg}: its memory {where} is a shared mapping of {entry.path}, but no descriptor "
            "of that file is open in this process and it cannot be reopened (unlinked, and "
            "/proc/self/map_files needs CAP_SYS_ADMIN); keep the file's descriptor open, or "
            "pass it to Client.register_host_fd")
    return Backing(fd, offset, entry.path)


def array_span(obj, arg: str = "obj") -> Tuple[int, int, bool]:
    """(address of the lowest byte, bytes spanned, read-only) of a numpy ndarray or torch tensor
    (CPU). Strided views span from their lowest to their highest element."""
    module = type(obj).__module__ or ""
    if module.startswith("torch") and hasattr(obj, "data_ptr"):
        device = getattr(getattr(obj, "device", None), "type", "cpu")
        if device != "cpu":
            raise ValueError(f"{arg}: a torch tensor on {obj.device}; GPU memory is registered "
                             "with kvrail.tensors / Client.register_cuda")
        if obj.numel() == 0:
            raise ValueError(f"{arg}: an empty tensor")
        itemsize = obj.element_size()
        strides = [s * itemsize for s in obj.stride()]
        return (*_span(obj.data_ptr(), list(obj.shape), strides, itemsize), False)
    interface = getattr(obj, "__array_interface__", None)
    if interface is None:
        raise TypeError(f"{arg}: a numpy ndarray or a torch CPU tensor, not {type(obj).__name__}")
    address, readonly = interface["data"]
    shape = list(interface["shape"])
    itemsize = obj.itemsize
    if any(n == 0 for n in shape):
        raise ValueError(f"{arg}: an empty array")
    strides = interface.get("strides")
    if strides is None:  # C-contiguous
        strides, step = [], itemsize
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    return (*_span(address, shape, list(strides), itemsize), bool(readonly))


def _span(address: int, shape, strides, itemsize: int) -> Tuple[int, int]:
    low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    return address + low, high - low + itemsize
