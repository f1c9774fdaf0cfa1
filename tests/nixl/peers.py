"""Starts nixl_peer.py processes and talks to them (shared by the test and the benchmark)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

from nixl_peer import PREFIX

HERE = os.path.dirname(os.path.abspath(__file__))


class PeerProcess:
    """One nixl_peer.py child process. Not thread-safe."""

    def __init__(self, name: str, backend: str, size: int, env: dict[str, str]) -> None:
        self.name = name
        fd, self.stderr_path = tempfile.mkstemp(prefix=f"nixl_peer.{name}.", suffix=".err",
                                                dir=env.get("TMPDIR", "/tmp"))
        self.stderr = os.fdopen(fd, "w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "nixl_peer.py"), "--name", name, "--backend",
             backend, "--bytes", str(size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        hello = self._read()
        self.metadata: str = hello["metadata"]
        self.base: int = int(hello["base"])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"peer {self.name} exited {self.proc.wait()}: {self.log()}")
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
            self.stderr.write(line)  # NIXL's log lines, kept with the peer's stderr

    def log(self) -> str:
        self.stderr.flush()
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def call(self, op: str, check: bool = True, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if check and answer.get("error"):
            raise RuntimeError(f"peer {self.name}: {op}: {answer['error']}\n{self.log()}")
        return answer

    def close(self) -> None:
        """Asks the child to quit; ends it (by pid) if it does not."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
        os.unlink(self.stderr_path)


def pair(backend: str, size: int, env: dict[str, str]) -> tuple[PeerProcess, PeerProcess]:
    """An initiator "A" and a target "B" that have loaded each other's metadata."""
    a = PeerProcess("A", backend, size, env)
    try:
        b = PeerProcess("B", backend, size, env)
    except Exception:
        a.close()
        raise
    assert a.call("add_remote", metadata=b.metadata)["name"] == "B"
    assert b.call("add_remote", metadata=a.metadata)["name"] == "A"
    return a, b


def scattered(size: int, piece: int, count: int, seed: int) -> list[list[int]]:
    """`count` pieces of `piece` bytes at random distinct piece-aligned slots on each side."""
    slots = size // piece
    if count > slots:
        raise ValueError(f"count: {count} pieces of {piece} bytes exceed {size} bytes")
    rng = np.random.default_rng(seed)
    local = rng.permutation(slots)[:count]
    remote = rng.permutation(slots)[:count]
    return [[int(l) * piece, int(r) * piece, piece] for l, r in zip(local, remote)]


def apply(dst: np.ndarray, src: np.ndarray, pieces: list[list[int]], write: bool) -> None:
    """What a transfer of `pieces` does to `dst` (the remote buffer for WRITE, the local for
    READ), reading from `src`."""
    for lo, ro, n in pieces:
        if write:
            dst[ro:ro + n] = src[lo:lo + n]
        else:
            dst[lo:lo + n] = src[ro:ro + n]
