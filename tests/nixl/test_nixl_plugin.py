"""kvrail's NIXL backend plugin (libplugin_KVRAIL.so) through NIXL's own Python API (the
nixl-cu13 wheel): two agents in two processes, a live kvraild, host memory, byte for byte."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Iterator

import numpy as np
import pytest

from nixl_peer import pattern
from peers import PeerProcess, apply, pair, scattered

SIZE = 16 << 20


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """A kvraild child on a socket in a temporary folder, ended by pid. Not thread-safe.
    With `node`: a loopback "node" of that id listening on 127.0.0.1:`port`, whose peer `peer`
    listens on `peer_port` (the fabric over libfabric's tcp provider on 127.0.0.1)."""

    def __init__(self, node: str = "", port: int = 0, peer: str = "", peer_port: int = 0) -> None:
        binary = os.environ.get("KVRAIL_DAEMON")
        if not binary:
            raise RuntimeError("KVRAIL_DAEMON is not set (bazel test //tests/nixl:...)")
        self.dir = tempfile.mkdtemp(prefix="kvnx.", dir="/tmp")
        self.socket = os.path.join(self.dir, "kvrail.sock")
        self.log_path = os.path.join(self.dir, "kvraild.log")
        args = [binary, "--socket", self.socket, "--log-level", "info"]
        if node:
            config = os.path.join(self.dir, "kvraild.textproto")
            with open(config, "w") as f:
                f.write(f'node_id: "{node}"\ninsecure_peers: true\n'
                        f'peers {{ key: "{peer}" value: "127.0.0.1:{peer_port}" }}\n'
                        'fabric {\n  nics: "127.0.0.1"\n  liveness_timeout_ms: 2000\n'
                        '  heartbeat_interval_ms: 200\n}\n')
            args += ["--tcp-listen", f"127.0.0.1:{port}", "--node-id", node, "--config", config]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while "ready: " not in self.log():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kvraild did not become ready: {self.log()}")
            time.sleep(0.01)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def env(daemon: Daemon) -> dict[str, str]:
    e = dict(os.environ)
    e["KVRAIL_SOCKET"] = daemon.socket
    if not e.get("NIXL_PLUGIN_DIR"):
        raise RuntimeError("NIXL_PLUGIN_DIR is not set (the folder of libplugin_KVRAIL.so)")
    return e


@pytest.fixture(scope="module")
def peers(env: dict[str, str]) -> Iterator[tuple[PeerProcess, PeerProcess]]:
    a, b = pair("KVRAIL", SIZE, env)
    yield a, b
    a.close()
    b.close()


def sha(array: np.ndarray) -> str:
    return hashlib.sha256(array.tobytes()).hexdigest()


def transfers_submitted(daemon: Daemon) -> int:
    """The daemon's count of accepted transfers (the kvrail CLI's stats)."""
    cli = os.environ["KVRAIL_CLI"]
    out = subprocess.run([cli, "--socket", daemon.socket, "--json", "stats"], check=True,
                         capture_output=True, text=True).stdout
    stats = json.loads(out)
    return int(stats.get("transfersSubmitted", stats.get("transfers_submitted", 0)))


def run_and_check(a: PeerProcess, b: PeerProcess, kind: str, pieces: list[list[int]],
                  notif: str = "", runs: int = 1) -> None:
    """Fills both buffers, moves `pieces` (A initiates), and checks both whole buffers against
    what the transfer must have done (every other byte unchanged)."""
    a.call("fill", seed=11)
    b.call("fill", seed=22)
    answer = a.call("xfer", kind=kind, remote="B", remote_base=b.base, pieces=pieces, notif=notif,
                    runs=runs)
    assert len(answer["seconds"]) == runs
    want_a = pattern(11, SIZE)
    want_b = pattern(22, SIZE)
    if kind == "WRITE":
        apply(want_b, want_a, pieces, write=True)
    else:
        apply(want_a, want_b, pieces, write=False)
    assert a.call("digest")["sha256"] == sha(want_a), "initiator buffer differs"
    assert b.call("digest")["sha256"] == sha(want_b), "target buffer differs"


def test_write_scattered_4k_blocks_one_kvrail_transfer_and_notification(
        daemon: Daemon, peers: tuple[PeerProcess, PeerProcess]) -> None:
    a, b = peers
    pieces = scattered(SIZE, 4096, 1024, seed=1)
    before = transfers_submitted(daemon)
    run_and_check(a, b, "WRITE", pieces, notif="req-1 done")
    # 1024 descriptors became one kvrail transfer (a block table), not 1024.
    assert transfers_submitted(daemon) - before == 1
    got = b.call("notifs", want=[["A", "req-1 done"]], timeout_s=10)["got"]
    assert ["A", "req-1 done"] in got


def test_read_scattered_32k_blocks_notifies_the_target(
        peers: tuple[PeerProcess, PeerProcess]) -> None:
    a, b = peers
    pieces = scattered(SIZE, 32768, 256, seed=2)
    run_and_check(a, b, "READ", pieces, notif="read-2")
    got = b.call("notifs", want=[["A", "read-2"]], timeout_s=10)["got"]
    assert got.count(["A", "read-2"]) == 1


def test_reposting_one_request_moves_the_data_each_time(
        peers: tuple[PeerProcess, PeerProcess]) -> None:
    a, b = peers
    run_and_check(a, b, "WRITE", scattered(SIZE, 8192, 300, seed=3), notif="again", runs=3)
    got = b.call("notifs", want=[["A", "again"]], timeout_s=10)["got"]
    deadline = time.monotonic() + 10
    while got.count(["A", "again"]) < 3 and time.monotonic() < deadline:
        got += b.call("notifs", want=[], timeout_s=0)["got"]
    assert got.count(["A", "again"]) == 3


def test_unaligned_pieces_move_as_byte_ranges(daemon: Daemon,
                                              peers: tuple[PeerProcess, PeerProcess]) -> None:
    a, b = peers
    rng = np.random.default_rng(4)
    # Odd sizes at odd offsets (not granule-aligned): byte ranges; three pieces contiguous on
    # both sides merge into one range.
    pieces = [[int(o) * 1001 + 3, int(r) * 1001 + 5, 777] for o, r in
              zip(rng.permutation(2000)[:40], rng.permutation(2000)[:40])]
    pieces += [[9_000_001, 12_000_003, 100], [9_000_101, 12_000_103, 50],
               [9_000_151, 12_000_153, 7]]
    before = transfers_submitted(daemon)
    run_and_check(a, b, "WRITE", pieces, notif="bytes")
    assert transfers_submitted(daemon) - before == 40 + 1 + 1  # ranges + the notification
    assert ["A", "bytes"] in b.call("notifs", want=[["A", "bytes"]], timeout_s=10)["got"]


def test_generated_notifications_both_ways(peers: tuple[PeerProcess, PeerProcess]) -> None:
    a, b = peers
    a.call("send_notif", remote="B", msg="hello from A")
    b.call("send_notif", remote="A", msg="hello from B")
    assert ["A", "hello from A"] in b.call("notifs", want=[["A", "hello from A"]])["got"]
    assert ["B", "hello from B"] in a.call("notifs", want=[["B", "hello from B"]])["got"]


def test_loopback_transfer_within_one_agent(peers: tuple[PeerProcess, PeerProcess]) -> None:
    a, _ = peers
    a.call("fill", seed=5)
    pieces = [[i * 8192, SIZE // 2 + (63 - i) * 8192, 8192] for i in range(64)]
    a.call("xfer", kind="WRITE", remote="A", remote_base=a.base, pieces=pieces, notif="self")
    want = pattern(5, SIZE)
    apply(want, pattern(5, SIZE), pieces, write=True)
    assert a.call("digest")["sha256"] == sha(want)
    assert ["A", "self"] in a.call("notifs", want=[["A", "self"]])["got"]


def test_private_memory_is_refused_with_a_clear_error(
        peers: tuple[PeerProcess, PeerProcess]) -> None:
    a, _ = peers
    answer = a.call("register_private", check=False, bytes=1 << 20)
    assert answer["error"], "private anonymous memory was accepted"
    assert "private or anonymous memory" in a.log()
    assert "share_memory_()" in a.log()


def test_a_descriptor_outside_the_registration_fails_and_moves_nothing(
        peers: tuple[PeerProcess, PeerProcess]) -> None:
    a, b = peers
    a.call("fill", seed=6)
    b.call("fill", seed=7)
    answer = a.call("xfer", check=False, kind="WRITE", remote="B", remote_base=b.base,
                    pieces=[[0, 0, 4096], [4096, SIZE - 100, 4096]])
    assert answer.get("error"), "a descriptor past the remote registration was accepted"
    assert b.call("digest")["sha256"] == sha(pattern(7, SIZE))


def test_a_torch_tensor_after_share_memory_registers_without_a_copy(
        daemon: Daemon, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """NIXL's own tensor registration (register_memory(tensor)) of a torch CPU tensor whose
    storage share_memory_() moved to /dev/shm; a loopback WRITE from its first half to its second
    half lands in the tensor itself."""
    import torch
    from nixl_cu13 import nixl_agent, nixl_agent_config

    monkeypatch.setenv("KVRAIL_SOCKET", daemon.socket)
    tensor = torch.arange(1 << 20, dtype=torch.int32).share_memory_()
    agent = nixl_agent("T", nixl_agent_config(backends=["KVRAIL"]))
    agent.register_memory(tensor)
    half = tensor.numel() // 2
    tensor[half:] = 0
    src = agent.get_xfer_descs([(tensor.data_ptr(), half * 4, 0)], "DRAM")
    dst = agent.get_xfer_descs([(tensor.data_ptr() + half * 4, half * 4, 0)], "DRAM")
    handle = agent.initialize_xfer("WRITE", src, dst, "T")
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    assert state == "DONE"
    assert torch.equal(tensor[half:], torch.arange(half, dtype=torch.int32))
    agent.release_xfer_handle(handle)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[tuple[Daemon, Daemon]]:
    p1, p2 = free_port(), free_port()
    n1 = Daemon("n1", p1, "n2", p2)
    try:
        n2 = Daemon("n2", p2, "n1", p1)
    except Exception:
        n1.stop()
        raise
    yield n1, n2
    n1.stop()
    n2.stop()


def test_across_nodes_writes_and_notifications_go_over_the_fabric(
        two_nodes: tuple[Daemon, Daemon]) -> None:
    """Agent A on node n1, agent B on node n2 (two daemons over the tcp fabric on loopback):
    loading each other's metadata exports each agent's registrations to the other's node; WRITEs
    (block tables and byte ranges) land byte for byte with their notifications; a READ from the
    other node is refused (kvrail pushes across nodes) and moves nothing."""
    n1, n2 = two_nodes
    plugin_dir = os.environ["NIXL_PLUGIN_DIR"]
    a = PeerProcess("A", "KVRAIL", SIZE, dict(os.environ, KVRAIL_SOCKET=n1.socket,
                                                NIXL_PLUGIN_DIR=plugin_dir))
    b = PeerProcess("B", "KVRAIL", SIZE, dict(os.environ, KVRAIL_SOCKET=n2.socket,
                                                NIXL_PLUGIN_DIR=plugin_dir))
    try:
        assert a.call("add_remote", metadata=b.metadata)["name"] == "B"
        assert b.call("add_remote", metadata=a.metadata)["name"] == "A"
        run_and_check(a, b, "WRITE", scattered(SIZE, 4096, 128, seed=8), notif="far-blocks")
        assert ["A", "far-blocks"] in b.call("notifs", want=[["A", "far-blocks"]])["got"]
        run_and_check(a, b, "WRITE", [[5, 7, 1000], [9000, 20001, 333]], notif="far-bytes")
        assert ["A", "far-bytes"] in b.call("notifs", want=[["A", "far-bytes"]])["got"]
        b.call("send_notif", remote="A", msg="far hello")
        assert ["B", "far hello"] in a.call("notifs", want=[["B", "far hello"]])["got"]
        a.call("fill", seed=9)
        answer = a.call("xfer", check=False, kind="READ", remote="B", remote_base=b.base,
                        pieces=scattered(SIZE, 4096, 8, seed=9))
        assert answer.get("error"), "a cross-node READ was accepted"
        assert "cross-node pull is not possible" in a.log()
        assert a.call("digest")["sha256"] == sha(pattern(9, SIZE))
    finally:
        a.close()
        b.close()


def test_no_daemon_fails_backend_creation_naming_the_socket(env: dict[str, str]) -> None:
    missing = os.path.join(tempfile.mkdtemp(prefix="kvnx.", dir="/tmp"), "none.sock")
    with pytest.raises(RuntimeError) as failed:
        PeerProcess("Z", "KVRAIL", 1 << 20, dict(env, KVRAIL_SOCKET=missing))
    assert "backend not created" in str(failed.value)
    assert missing in str(failed.value)
    os.rmdir(os.path.dirname(missing))
