"""Across nodes from Python: two kvraild on loopback, nodes "a" (prefill) and "b" (decode), peered
over libfabric's tcp provider. The decode exports its pool to node a (Region.export), the prefill
pushes into it (dst_node_id="b"); a cross-node pull is refused naming spec.src.node_id."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time

import numpy as np
import pytest

import kvrail
from conftest import Daemon
from kvrail import transfer_pb2
from kvtest import Pool, layout

SUCCEEDED = transfer_pb2.TRANSFER_STATE_SUCCEEDED


def free_ports(n: int):
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_config(folder: str, node: str, peer: str, peer_port: int) -> str:
    path = os.path.join(folder, f"{node}.textproto")
    with open(path, "w") as f:
        f.write(f'node_id: "{node}"\n'
                "insecure_peers: true\n"
                f'peers {{ key: "{peer}" value: "127.0.0.1:{peer_port}" }}\n'
                'fabric {\n  nics: "127.0.0.1"\n  slots: 4\n  slot_bytes: 262144\n'
                "  liveness_timeout_ms: 2000\n  heartbeat_interval_ms: 200\n}\n")
    return path


@pytest.fixture(scope="module")
def nodes():
    folder = tempfile.mkdtemp(prefix="kvpy-nodes.", dir="/tmp")
    port_a, port_b = free_ports(2)
    started = []
    try:
        for node, port, peer, peer_port in (("a", port_a, "b", port_b),
                                            ("b", port_b, "a", port_a)):
            started.append(Daemon([
                "--config", node_config(folder, node, peer, peer_port), "--node-id", node,
                "--tcp-listen", f"127.0.0.1:{port}", "--tile-bytes", "65536",
                "--drain-timeout-ms", "1000"]))
        yield started
    finally:
        for d in started:
            d.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def a(nodes):
    with kvrail.connect(nodes[0].socket) as c:
        yield c


@pytest.fixture
def b(nodes):
    with kvrail.connect(nodes[1].socket) as c:
        yield c


def push(a, src_region, src_blocks, dst_id, dst_blocks, **fields):
    """Submits on node a into node b, retrying while the peers are still saying hello."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return a.transfer(src_region, src_blocks, dst_id, dst_blocks, dst_node_id="b",
                              timeout_ms=60000, **fields)
        except kvrail.UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_export_then_push_across_nodes_byte_for_byte(nodes, a, b):
    src = Pool(a, layout(blocks=32), writable=False, name="prefill")
    dst = Pool(b, layout(blocks=32), writable=True, name="decode")
    lease = dst.region.export("a")
    assert (lease.region_id, lease.owner_node_id, lease.holder_node_id) == (dst.id, "b", "a")
    assert lease.size_bytes == dst.layout.nbytes
    assert lease.writable
    assert lease.paged_kv.num_blocks == 32
    src.fill_random(11)
    src_blocks, dst_blocks = [3, 17, 0, 29, 8], [30, 1, 12, 5, 22]
    # The export opens the region to node a; the owner's write grant says which of a's tenants
    # may write it (checked on node b).
    transfer = push(a, src.region, src_blocks, dst.id, dst_blocks, notification=b"req-7",
                    dst_grant=dst.region.grant(write=True))
    status = transfer.result(timeout=60)
    assert status.state == SUCCEEDED
    assert status.path == transfer_pb2.PATH_FABRIC
    tokens = 5 * 4
    np.testing.assert_array_equal(dst.tokens(dst_blocks, tokens), src.tokens(src_blocks, tokens))
    untouched = [blk for blk in range(32) if blk not in dst_blocks]
    assert (dst.view[:, :, untouched].view(np.uint8) == 0xAB).all()
    # The decode learns of it from its own daemon, with the prefill's bytes.
    deadline = time.monotonic() + 10
    seen = []
    while not seen and time.monotonic() < deadline:
        seen = [n for n in b.poll_notifications(timeout=1.0) if n.notification == b"req-7"]
    assert seen, "no notification on node b"
    assert seen[0].state == SUCCEEDED


def test_push_between_engine_owned_arrays(nodes, a, b):
    # Both ends are the engines' own shared memory (register_host_array), not HostBuffers.
    from multiprocessing import shared_memory
    lay = layout()
    src_shm = shared_memory.SharedMemory(create=True, size=lay.nbytes)
    dst_shm = shared_memory.SharedMemory(create=True, size=lay.nbytes)
    try:
        src = np.ndarray((lay.nbytes // 2,), dtype=np.uint16, buffer=src_shm.buf)
        dst = np.ndarray((lay.nbytes // 2,), dtype=np.uint16, buffer=dst_shm.buf)
        src_region = a.register_host_array(src, layout=lay)
        dst_region = b.register_host_array(dst, layout=lay, writable=True)
        b.export_region(dst_region, "a")
        src[:] = np.random.default_rng(3).integers(0, 1 << 16, size=src.shape, dtype=np.uint16)
        dst[:] = 0
        push(a, src_region, [2, 9], dst_region.id, [6, 4],
             dst_grant=dst_region.grant(write=True)).result(timeout=60)
        view = lambda arr: np.ndarray(lay.shape6(), np.uint16, arr, strides=lay.strides6())
        np.testing.assert_array_equal(view(dst)[:, :, 6], view(src)[:, :, 2])
        np.testing.assert_array_equal(view(dst)[:, :, 4], view(src)[:, :, 9])
        assert not view(dst)[:, :, [0, 1, 2, 3, 5, 7]].any()
        src_region.unregister()
        dst_region.unregister()
        del src, dst, view
    finally:
        for shm in (src_shm, dst_shm):
            shm.close()
            shm.unlink()


def test_export_is_for_the_owner_and_a_known_peer(nodes, a, b):
    dst = Pool(b, layout(), writable=True, name="decode")
    with kvrail.connect(nodes[1].socket) as intruder:
        with pytest.raises(kvrail.KvrailError) as denied:
            intruder.export_region(dst.id, "a")
        assert denied.value.code == kvrail.StatusCode.PERMISSION_DENIED
        assert "region_id" in denied.value.message
    with pytest.raises(kvrail.InvalidArgumentError, match="peer_node"):
        dst.region.export("")


def test_a_cross_node_pull_is_refused_naming_src_node_id(nodes, a, b):
    src = Pool(a, layout(), writable=False, name="prefill")
    dst = Pool(b, layout(), writable=True, name="decode")
    with pytest.raises(kvrail.KvrailError) as refused:
        b.transfer(src.id, [0, 1], dst.region, [2, 3], src_node_id="a")
    assert refused.value.code == kvrail.StatusCode.UNIMPLEMENTED
    message = refused.value.message
    assert message.startswith("spec.src.node_id: 'a' is another node")
    assert "no fabric path configured" not in message
    assert "spec.dst.node_id = 'b'" in message  # the push that does it


DECODE = """
import json, sys, time
import kvrail
from kvtest import Pool, layout
b = kvrail.connect(sys.argv[1])
dst = Pool(b, layout(layers=4, blocks=16), writable=True, name="decode")
dst.region.export("a")
print(json.dumps({"region": dst.id, "grant": dst.region.grant(write=True)}), flush=True)
time.sleep(600)
"""


def test_a_push_into_a_killed_decode_fails_and_writes_nothing(nodes, a):
    # The decode process dies while the prefill streams into it layer by layer: its daemon ends
    # its record of the inbound transfer, lands no more tiles, and the prefill's transfer fails.
    import signal
    import subprocess
    import sys
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__))] + sys.path)  # kvtest and kvrail
    child = subprocess.Popen([sys.executable, "-c", DECODE, nodes[1].socket], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    assert line, child.stderr.read()
    decode = __import__("json").loads(line)
    region = int(decode["region"])
    src = Pool(a, layout(layers=4, blocks=16), writable=False, name="prefill")
    src.fill_random(5)
    transfer = push(a, src.region, [1, 2], region, [3, 4], layerwise=True,
                    dst_grant=decode["grant"])
    transfer.mark_ready(0, 1)
    deadline = time.monotonic() + 10
    while transfer.status.bytes_done == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert transfer.status.bytes_done > 0  # layer 0 landed while the decode lived
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    time.sleep(0.3)  # the decode's daemon sees its session end
    transfer.mark_ready(1, 3)
    status = transfer.wait(timeout=30)
    assert status.state in (transfer_pb2.TRANSFER_STATE_FAILED,
                            transfer_pb2.TRANSFER_STATE_CANCELLED), status
    assert status.bytes_done < status.bytes_total
