"""An engine's own host memory registered without a copy (Client.register_host_array,
Client.register_host_fd): numpy over multiprocessing.shared_memory, an mmap of a /dev/shm file,
an mmap of a memfd, and a memfd by descriptor. Each test writes the memory AFTER registering it
and then moves it, so a copy taken at registration would show as stale bytes; and a transfer
into registered memory must show in the engine's own view with no read-back."""
from __future__ import annotations

import mmap
import os
import tempfile
import time
from multiprocessing import shared_memory

import numpy as np
import pytest

import kvrail
from kvrail import host_memory, transfer_pb2
from kvtest import layout

SUCCEEDED = transfer_pb2.TRANSFER_STATE_SUCCEEDED
LAYOUT = layout()  # 3 layers, K and V, 16 blocks of 4 tokens, 4 heads of 8 bf16, NHD


def paged(array: np.ndarray) -> np.ndarray:
    """`array`'s bytes as [L, P, B, T, H, D] of uint16 (LAYOUT)."""
    return np.ndarray(LAYOUT.shape6(), dtype=np.uint16, buffer=array,
                      strides=LAYOUT.strides6())


def move_and_check(client, src_region, src_view, dst_region, dst_view, seed: int) -> None:
    """Writes random data into src_view now (after registration), moves blocks, and checks that
    dst_view (the engine's own view of the destination) holds them."""
    rng = np.random.default_rng(seed)
    src_view[...] = rng.integers(0, 1 << 16, size=src_view.shape, dtype=np.uint16)
    dst_view[...] = 0xABAB
    src_blocks, dst_blocks = [9, 0, 14], [2, 7, 11]
    status = client.transfer(src_region, src_blocks, dst_region, dst_blocks).result(timeout=30)
    assert status.state == SUCCEEDED
    for s, d in zip(src_blocks, dst_blocks):
        np.testing.assert_array_equal(dst_view[:, :, d], src_view[:, :, s])
    untouched = [b for b in range(LAYOUT.num_blocks) if b not in dst_blocks]
    assert (dst_view[:, :, untouched] == 0xABAB).all()


def test_numpy_over_multiprocessing_shared_memory(client):
    src_shm = shared_memory.SharedMemory(create=True, size=LAYOUT.nbytes)
    dst_shm = shared_memory.SharedMemory(create=True, size=LAYOUT.nbytes)
    try:
        src = np.ndarray((LAYOUT.nbytes,), dtype=np.uint8, buffer=src_shm.buf)
        dst = np.ndarray((LAYOUT.nbytes,), dtype=np.uint8, buffer=dst_shm.buf)
        src_region = client.register_host_array(src, layout=LAYOUT, name="engine src")
        dst_region = client.register_host_array(dst, layout=LAYOUT, writable=True,
                                                name="engine dst")
        assert src_region.info.spec.size_bytes == LAYOUT.nbytes
        assert src_region.info.spec.name == "engine src"
        assert dst_region.info.spec.writable
        move_and_check(client, src_region, paged(src), dst_region, paged(dst), 1)
        # Again, other data: the daemon reads the pages as they are now, every time.
        move_and_check(client, src_region, paged(src), dst_region, paged(dst), 2)
        src_region.unregister()
        dst_region.unregister()
        del src, dst
    finally:
        for shm in (src_shm, dst_shm):
            shm.close()
            shm.unlink()


def test_a_view_inside_a_larger_mapping_registers_at_its_offset(client):
    # A /dev/shm file mapped whole; the pools are slices at unaligned offsets inside it, and the
    # descriptor is closed before registering (the file is found again by its path).
    head = 3 * 4096 + 200
    total = head + 2 * LAYOUT.nbytes + 64
    fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="kvpy-engine.")
    try:
        os.ftruncate(fd, total)
        mapping = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fd)
        whole = np.frombuffer(mapping, dtype=np.uint8)
        whole[:] = 0x5A
        src = whole[head:head + LAYOUT.nbytes]
        dst = whole[head + LAYOUT.nbytes:head + 2 * LAYOUT.nbytes]
        src_region = client.register_host_array(src, layout=LAYOUT)
        dst_region = client.register_host_array(dst, layout=LAYOUT, writable=True)
        move_and_check(client, src_region, paged(src), dst_region, paged(dst), 3)
        # Bytes around the pools are untouched.
        assert (whole[:head] == 0x5A).all()
        assert (whole[head + 2 * LAYOUT.nbytes:] == 0x5A).all()
        src_region.unregister()
        dst_region.unregister()
        del src, dst, whole
        mapping.close()
    finally:
        os.unlink(path)


def test_numpy_over_an_mmap_of_a_memfd(client):
    fd = os.memfd_create("engine-kv")
    try:
        os.ftruncate(fd, 2 * LAYOUT.nbytes)
        mapping = mmap.mmap(fd, 2 * LAYOUT.nbytes)
        whole = np.frombuffer(mapping, dtype=np.uint8)
        src, dst = whole[:LAYOUT.nbytes], whole[LAYOUT.nbytes:]
        src_region = client.register_host_array(src, layout=LAYOUT)
        dst_region = client.register_host_array(dst, layout=LAYOUT, writable=True)
        move_and_check(client, src_region, paged(src), dst_region, paged(dst), 4)
        src_region.unregister()
        dst_region.unregister()
        del src, dst, whole
        mapping.close()
    finally:
        os.close(fd)


def test_a_memfd_the_engine_made_registered_by_descriptor(client):
    fd = os.memfd_create("engine-pool")
    offset = 8192 + 12  # the pools start inside the file, not on a page boundary
    os.ftruncate(fd, offset + 2 * LAYOUT.nbytes)
    mapping = mmap.mmap(fd, offset + 2 * LAYOUT.nbytes)
    src_region = client.register_host_fd(fd, offset, LAYOUT.nbytes, layout=LAYOUT,
                                         name="engine src")
    dst_region = client.register_host_fd(fd, offset + LAYOUT.nbytes, LAYOUT.nbytes,
                                         layout=LAYOUT, writable=True, name="engine dst")
    os.close(fd)  # the engine's descriptor is its own; the regions live on
    assert src_region.info.spec.size_bytes == LAYOUT.nbytes
    assert dst_region.info.spec.name == "engine dst"
    whole = np.frombuffer(mapping, dtype=np.uint8)
    src = whole[offset:offset + LAYOUT.nbytes]
    dst = whole[offset + LAYOUT.nbytes:]
    move_and_check(client, src_region, paged(src), dst_region, paged(dst), 5)
    src_region.unregister()
    dst_region.unregister()
    del src, dst, whole
    mapping.close()


def test_a_host_buffer_view_is_an_array_too(client):
    buffer = kvrail.HostBuffer(LAYOUT.nbytes)
    target = kvrail.HostBuffer(LAYOUT.nbytes)
    src_region = client.register_host_array(buffer.ndarray(), layout=LAYOUT)
    dst_region = client.register_host_array(target.ndarray(), layout=LAYOUT, writable=True)
    move_and_check(client, src_region, buffer.paged_view(LAYOUT), dst_region,
                   target.paged_view(LAYOUT), 6)


def test_anonymous_and_private_memory_is_refused_naming_obj(client):
    with pytest.raises(kvrail.InvalidArgumentError) as anonymous:
        client.register_host_array(np.zeros(LAYOUT.nbytes, dtype=np.uint8), layout=LAYOUT)
    assert anonymous.value.message.startswith("obj: ")
    assert "anonymous" in anonymous.value.message
    assert "share_memory_" in anonymous.value.message

    fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="kvpy-private.")
    try:
        os.ftruncate(fd, LAYOUT.nbytes)
        private = mmap.mmap(fd, LAYOUT.nbytes, mmap.MAP_PRIVATE)
        with pytest.raises(kvrail.InvalidArgumentError) as cow:
            client.register_host_array(np.frombuffer(private, dtype=np.uint8))
        assert cow.value.message.startswith("obj: ")
        assert "private" in cow.value.message
        # Read-only memory cannot back a writable region.
        shared = mmap.mmap(fd, LAYOUT.nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
        with pytest.raises(kvrail.InvalidArgumentError) as readonly:
            client.register_host_array(np.frombuffer(shared, dtype=np.uint8), writable=True)
        assert readonly.value.message.startswith("obj: ")
        del private, shared  # unmapped once the arrays the tracebacks hold are gone
    finally:
        os.close(fd)
        os.unlink(path)

    with pytest.raises(kvrail.InvalidArgumentError) as not_an_array:
        client.register_host_array(b"bytes")
    assert not_an_array.value.message.startswith("obj: ")
    with pytest.raises(kvrail.InvalidArgumentError) as too_small:
        client.register_host_array(kvrail.HostBuffer(4096).ndarray(), layout=LAYOUT)
    assert too_small.value.message.startswith("layout: ")
    assert client.list_regions() == []


def test_register_host_fd_names_the_bad_argument(client):
    fd = os.memfd_create("small")
    os.ftruncate(fd, 4096)
    try:
        for args, field in [((-1, 0, 16), "fd: "), ((fd, -1, 16), "offset: "),
                            ((fd, 0, 0), "nbytes: "), ((fd, 4000, 200), "nbytes: "),
                            ((fd, 4096, 1), "nbytes: ")]:
            with pytest.raises(kvrail.InvalidArgumentError) as bad:
                client.register_host_fd(*args)
            assert bad.value.message.startswith(field), (args, bad.value.message)
        r, w = os.pipe()
        with pytest.raises(kvrail.InvalidArgumentError) as pipe:
            client.register_host_fd(r, 0, 16)
        assert "not a regular file" in pipe.value.message
        os.close(r)
        os.close(w)
        # A region over a read-only descriptor cannot be writable: the daemon says so.
        ro = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
        with pytest.raises(kvrail.KvrailError) as denied:
            client.register_host_fd(ro, 0, 4096, writable=True)
        assert "spec.writable" in denied.value.message
        os.close(ro)
    finally:
        os.close(fd)
    assert client.list_regions() == []


def test_recover_registers_the_same_memory_again(fresh_daemon):
    with kvrail.connect(fresh_daemon.socket) as client:
        fd = os.memfd_create("engine-pool")
        os.ftruncate(fd, 2 * LAYOUT.nbytes)
        mapping = mmap.mmap(fd, 2 * LAYOUT.nbytes)
        whole = np.frombuffer(mapping, dtype=np.uint8)
        src_region = client.register_host_fd(fd, 0, LAYOUT.nbytes, layout=LAYOUT)
        os.close(fd)  # recover() must work from the Region's own duplicate
        dst = whole[LAYOUT.nbytes:]
        dst_region = client.register_host_array(dst, layout=LAYOUT, writable=True)
        assert fresh_daemon.restart() == 0
        deadline = time.monotonic() + 10
        while not client.session_lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.session_lost
        # The first call on the gRPC channel after the restart may meet the old connection
        # (UNAVAILABLE "Broken pipe"); recover() is retried as an application would.
        for _ in range(50):
            try:
                moved = client.recover()
                break
            except kvrail.UnavailableError:
                time.sleep(0.1)
        assert len(moved) == 2
        move_and_check(client, src_region, paged(whole[:LAYOUT.nbytes]), dst_region,
                       paged(dst), 7)
        src_region.unregister()
        dst_region.unregister()
        del dst, whole
        mapping.close()


MAPS = """\
7f0000000000-7f0000002000 rw-s 00000000 00:01 1234                       /dev/shm/a
7f0000002000-7f0000004000 r--s 00002000 00:01 1234                       /dev/shm/a
7f0000004000-7f0000005000 rw-s 00000000 00:01 99                         /memfd:x (deleted)
7f0000005000-7f0000006000 rw-p 00000000 00:00 0
"""


def test_maps_parsing_and_the_covering_mapping():
    entries = host_memory.parse_maps(MAPS)
    assert [e.inode for e in entries] == [1234, 1234, 99, 0]
    assert entries[0].shared and not entries[3].shared
    assert entries[3].path == ""
    assert entries[2].path == "/memfd:x (deleted)"
    assert entries[0].dev == os.makedev(0, 1)
    # Anonymous memory, and ranges that leave one file's mapping, are refused naming the arg.
    with pytest.raises(ValueError, match="^tensor: .*anonymous"):
        host_memory.find_backing(0x7f0000005010, 16, arg="tensor", maps_text=MAPS)
    with pytest.raises(ValueError, match="^obj: .*more than one mapping"):
        host_memory.find_backing(0x7f0000001000, 0x4000, maps_text=MAPS)
    with pytest.raises(ValueError, match="^obj: .*not mapped"):
        host_memory.find_backing(0x1000, 16, maps_text=MAPS)
    # Split entries of one file with the same protection merge (checked up to the fd lookup).
    merged = host_memory._covering(
        host_memory.parse_maps(MAPS.replace("r--s 00002000", "rw-s 00002000")), 0x7f0000001000,
        0x2000, "obj")
    assert (merged.start, merged.end, merged.offset) == (0x7f0000000000, 0x7f0000004000, 0)


def test_array_span_of_strided_views():
    base = np.zeros((4, 8), dtype=np.uint16)
    address = base.__array_interface__["data"][0]
    assert host_memory.array_span(base)[:2] == (address, 64)
    column = base[:, 3]  # stride 16 bytes, 4 elements
    assert host_memory.array_span(column)[:2] == (address + 6, 3 * 16 + 2)
    reversed_rows = base[::-1]
    assert host_memory.array_span(reversed_rows)[:2] == (address, 64)
    assert host_memory.array_span(np.frombuffer(b"abcd", dtype=np.uint8))[2] is True
