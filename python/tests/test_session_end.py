"""A pull whose decode process dies: a real decode process (a child) registers its pool over a
/dev/shm file and submits a layer-wise pull of the prefill's blocks (the prefill's read grant, the
prefill's ready flags). The child is killed with SIGKILL; the transfer must end at once, FAILED or
CANCELLED naming the reason (the prefill hears it as a notification), and when the prefill then
marks its layers ready no byte may land in the dead process's memory."""
from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

import kvrail
from kvrail import transfer_pb2
from kvtest import Pool, layout

POISON = 0xAB
FINAL_FAILED = (transfer_pb2.TRANSFER_STATE_FAILED, transfer_pb2.TRANSFER_STATE_CANCELLED)

DECODE = textwrap.dedent("""
    import json, mmap, os, sys, time
    import numpy as np
    import kvrail
    from kvrail import transfer_pb2
    from kvrail.layouts import PagedLayout
    args = json.loads(sys.argv[1])
    client = kvrail.connect(args["socket"])
    lay = PagedLayout(**args["layout"])
    fd = os.open(args["pool"], os.O_RDWR)
    pool = np.frombuffer(mmap.mmap(fd, lay.nbytes), dtype=np.uint8)
    dst = client.register_host_array(pool, layout=lay, writable=True, name="decode pool")
    extra = {}
    if args["flags_region"]:
        extra["ready_flags"] = transfer_pb2.FlagArray(
            region_id=args["flags_region"], byte_offset=0, value=1, grant=args["flags_grant"])
    transfer = client.transfer(args["src"], args["blocks"], dst, args["blocks"],
                               src_grant=args["src_grant"], layerwise=True,
                               notification=b"req-dead", **extra)
    print(json.dumps({"transfer": transfer.id}), flush=True)
    time.sleep(600)
""")


def run_decode(daemon, src: Pool, pool_path: str, blocks, flags_region=0, flags_grant=""):
    """Starts the decode child; returns (process, transfer id)."""
    args = {"socket": daemon.socket, "layout": src.layout.__dict__, "pool": pool_path,
            "src": src.id, "src_grant": src.region.grant(), "blocks": blocks,
            "flags_region": flags_region, "flags_grant": flags_grant}
    child = subprocess.Popen([sys.executable, "-c", DECODE, json.dumps(args)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    if not line:
        child.wait()
        raise AssertionError(f"decode child failed: {child.stderr.read()}")
    return child, json.loads(line)["transfer"]


def notification_for(client, transfer_id: int, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n in client.poll_notifications(timeout=0.05):
            if n.transfer_id == transfer_id:
                return n
    return None


def decode_pool(lay):
    fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="kvpy-decode.")
    os.ftruncate(fd, lay.nbytes)
    view = np.frombuffer(mmap.mmap(fd, lay.nbytes), dtype=np.uint8)
    os.close(fd)
    view[:] = POISON
    return path, view


def test_a_killed_decode_ends_its_pull_before_the_prefill_marks_layers(fresh_daemon):
    lay = layout(layers=4, blocks=16)
    with kvrail.connect(fresh_daemon.socket) as prefill:
        src = Pool(prefill, lay, writable=False, name="prefill pool")
        src.fill_random(21)
        flags_buffer = kvrail.HostBuffer(4096)
        flags_region = prefill.register_host_buffer(flags_buffer, name="prefill flags")
        flags = kvrail.FlagArray(flags_buffer, flags_region, count=lay.num_layers)
        path, pool = decode_pool(lay)
        try:
            child, transfer_id = run_decode(fresh_daemon, src, path, [1, 5, 9],
                                            flags_region=flags_region.id,
                                            flags_grant=flags_region.grant())
            flags.signal(0, 1)  # layer 0 is written before the decode dies: it may move
            time.sleep(0.3)
            killed = time.monotonic()
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            ended = notification_for(prefill, transfer_id, timeout=10)
            seen_after = time.monotonic() - killed
            assert ended is not None, "the prefill heard nothing of the dead decode's pull"
            assert ended.state in FINAL_FAILED, transfer_pb2.TransferState.Name(ended.state)
            assert "destination" in ended.error_message and "ended" in ended.error_message, \
                ended.error_message
            print(f"pull ended {seen_after * 1000:.1f} ms after SIGKILL: {ended.error_message}")
            assert seen_after < 2.0, f"the end was seen {seen_after:.2f} s after the kill"
            landed = pool.reshape(-1).copy()
            # The prefill now marks the remaining layers ready: nothing more may be written.
            for layer in range(1, lay.num_layers):
                flags.signal(layer, 1)
            time.sleep(0.5)
            np.testing.assert_array_equal(pool.reshape(-1), landed)
            paged = np.ndarray(lay.shape6(), np.uint16, pool, strides=lay.strides6())
            assert (paged[1:].view(np.uint8) == POISON).all()  # layers 1.. never moved
        finally:
            os.unlink(path)


def test_a_killed_decode_ends_its_pull_in_mark_ready_mode_too(fresh_daemon):
    # Without flags the pull waits on MarkReady; the prefill owns the source and marks layers
    # (no grant of the decode's needed). After the kill its MarkReady is refused, nothing moves.
    lay = layout(layers=3, blocks=16)
    with kvrail.connect(fresh_daemon.socket) as prefill:
        src = Pool(prefill, lay, writable=False, name="prefill pool")
        src.fill_random(22)
        path, pool = decode_pool(lay)
        try:
            child, transfer_id = run_decode(fresh_daemon, src, path, [2, 3])
            prefill.mark_ready(transfer_id, 0, 1)  # the producer's own call, no grant
            paged = np.ndarray(lay.shape6(), np.uint16, pool, strides=lay.strides6())
            deadline = time.monotonic() + 10
            while (paged[0, :, 2:4] != src.view[0, :, 2:4]).any() and \
                    time.monotonic() < deadline:
                time.sleep(0.01)
            np.testing.assert_array_equal(paged[0, :, 2:4], src.view[0, :, 2:4])  # layer 0 moved
            killed = time.monotonic()
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            ended = notification_for(prefill, transfer_id, timeout=10)
            assert ended is not None
            assert ended.state in FINAL_FAILED
            assert time.monotonic() - killed < 2.0
            landed = pool.copy()
            try:
                prefill.mark_ready(transfer_id, 1, 2)
            except kvrail.KvrailError as e:
                assert e.code in (kvrail.StatusCode.FAILED_PRECONDITION,
                                  kvrail.StatusCode.NOT_FOUND), e
            time.sleep(0.3)
            np.testing.assert_array_equal(pool, landed)
            assert (paged[1:].view(np.uint8) == POISON).all()
        finally:
            os.unlink(path)
