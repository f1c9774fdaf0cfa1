"""One NIXL agent in its own process, driven by JSON lines on stdin (one answer line on stdout per
command, prefixed with PREFIX). The tests and the benchmark start two of these and move data
between them through NIXL's own Python API (nixl_cu13), with whichever backend they name:
"KVRAIL" (kvrail's plugin, from $NIXL_PLUGIN_DIR) or "UCX" (NIXL's own).

The agent's memory is one shared host buffer (a memfd mapped MAP_SHARED, so kvraild can map it
too; UCX takes any memory), registered with NIXL as DRAM at start.

Commands (JSON objects, field "op"):
  fill {seed}                      buffer := the seed's byte pattern (pattern(seed, size))
  digest {}                        {"sha256": of the whole buffer}
  digest_ranges {ranges}           {"sha256": of the bytes of [[off, len], ...] in order}
  add_remote {metadata}            load a peer's metadata (hex); {"name": ...}
  xfer {kind, remote, remote_base, pieces, notif, runs, fresh}
                                   pieces: [[local_off, remote_off, len], ...]; one NIXL transfer
                                   request posted `runs` times, or (fresh) a new request per run;
                                   {"seconds": [...]}: per run, from request (fresh) or post to
                                   done
  notifs {want, timeout_s}         polls get_new_notifs until `want` (a list of [agent, msg]) all
                                   arrived or the timeout; {"got": [[agent, msg], ...]}
  send_notif {remote, msg}         nixl genNotif
  register_private {bytes}         tries to register private anonymous memory; {"error": ...}
  quit
"""
from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import sys
import time
from typing import Any

import numpy as np

from nixl_cu13 import nixl_agent, nixl_agent_config


# Answers start with this; NIXL's own log lines go to stdout too.
PREFIX = "@@ "


def pattern(seed: int, size: int) -> np.ndarray:
    """The byte pattern `fill` writes: the same in every process for the same seed."""
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)


class Peer:
    """Not thread-safe: one command at a time."""

    def __init__(self, name: str, backend: str, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create(f"nixl-peer-{name}")
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.buf = np.frombuffer(self.map, dtype=np.uint8)
        self.base = self.buf.ctypes.data
        self.backend = backend
        self.agent = nixl_agent(name, nixl_agent_config(backends=[backend]))
        self.reg = self.agent.register_memory([(self.base, size, 0, "")], "DRAM")

    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "fill":
            self.buf[:] = pattern(int(cmd["seed"]), self.size)
            return {"ok": True}
        if op == "digest":
            return {"sha256": hashlib.sha256(self.buf.tobytes()).hexdigest()}
        if op == "digest_ranges":
            h = hashlib.sha256()
            for off, n in cmd["ranges"]:
                h.update(self.buf[off:off + n].tobytes())
            return {"sha256": h.hexdigest()}
        if op == "add_remote":
            name = self.agent.add_remote_agent(bytes.fromhex(cmd["metadata"]))
            return {"name": name.decode() if isinstance(name, bytes) else name}
        if op == "xfer":
            return self.xfer(cmd)
        if op == "notifs":
            return self.notifs(cmd)
        if op == "send_notif":
            self.agent.send_notif(cmd["remote"], cmd["msg"].encode())
            return {"ok": True}
        if op == "register_private":
            private = np.zeros(int(cmd["bytes"]), dtype=np.uint8)
            try:
                self.agent.register_memory([(private.ctypes.data, private.nbytes, 0, "")], "DRAM")
            except Exception as e:  # NIXL raises its own status exception types
                return {"error": f"{type(e).__name__}: {e}"}
            return {"error": None}
        raise ValueError(f"op: unknown command {op!r}")

    def xfer(self, cmd: dict[str, Any]) -> dict[str, Any]:
        pieces = cmd["pieces"]
        remote_base = int(cmd["remote_base"])
        local = self.agent.get_xfer_descs([(self.base + lo, n, 0) for lo, _, n in pieces], "DRAM")
        remote = self.agent.get_xfer_descs([(remote_base + ro, n, 0) for _, ro, n in pieces],
                                           "DRAM")
        notif = cmd.get("notif", "").encode()
        fresh = bool(cmd.get("fresh", False))

        def request() -> Any:
            return self.agent.initialize_xfer(cmd["kind"], local, remote, cmd["remote"], notif,
                                              backends=[self.backend])

        seconds = []
        handle = None if fresh else request()
        try:
            for _ in range(int(cmd.get("runs", 1))):
                start = time.perf_counter()
                if fresh:
                    handle = request()
                state = self.agent.transfer(handle, notif)
                while state == "PROC":
                    state = self.agent.check_xfer_state(handle)
                seconds.append(time.perf_counter() - start)
                if state != "DONE":
                    return {"error": f"transfer ended {state}", "seconds": seconds}
                if fresh:
                    self.agent.release_xfer_handle(handle)
                    handle = None
        finally:
            if handle is not None:
                self.agent.release_xfer_handle(handle)
        return {"seconds": seconds}

    def notifs(self, cmd: dict[str, Any]) -> dict[str, Any]:
        want = [tuple(w) for w in cmd["want"]]
        got: list[list[str]] = []
        deadline = time.monotonic() + float(cmd.get("timeout_s", 10))
        while True:
            for agent, msgs in self.agent.get_new_notifs().items():
                got.extend([agent, m.decode(errors="replace")] for m in msgs)
            if all(list(w) in got for w in want) or time.monotonic() > deadline:
                return {"got": got}
            time.sleep(0.002)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    args = parser.parse_args()
    peer = Peer(args.name, args.backend, args.bytes)
    out = sys.stdout
    out.write(PREFIX + json.dumps({"metadata": peer.agent.get_agent_metadata().hex(),
                                   "base": peer.base}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            answer = peer.handle(cmd)
        except Exception as e:  # reported to the driver, which fails the test with it
            answer = {"error": f"{type(e).__name__}: {e}"}
        out.write(PREFIX + json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
