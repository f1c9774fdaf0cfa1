"""One side of one system in the versus benchmark: a process the coordinator (tools/bench/versus.py)
drives with JSON lines on stdin, answering one JSON line each on the protocol pipe (the original
stdout; the process's own stdout goes to stderr, so a library's prints cannot corrupt it).

Roles: "src" holds the source pool and issues the writes (prefill pushing KV, as Mooncake's
connector and vLLM's NIXL push worker do); "dst" holds the destination pool and checks it.

Ops (each answers {"ok": true, ...} or {"ok": false, "error": text}):
  setup    {system, role, kind, blocks, seed, options} -> {"info": what the peer needs,
           "register_s": seconds spent registering memory}
  connect  {peer: the other side's info} -> {"connect_s"}   (metadata exchange, src side)
  poison   {} -> {}                     (dst: zero the pool, so stale bytes cannot verify)
  run      {reps, seed} -> {"seconds": [...], "detail": {...}}   (src: timed requests)
  verify   {seed} -> {"mismatch": "" or where}                    (dst)
  quit
"""
from __future__ import annotations

import json
import mmap
import os
import sys
import time
from typing import Any, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvshape  # noqa: E402  (sibling module; this file runs as a script)


def _anon(nbytes: int) -> mmap.mmap:
    """Page-aligned private anonymous memory (what an engine's host KV pool is)."""
    return mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _address(buffer) -> int:
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


class Side:
    """Common state: the pool's memory as uint64 words, the request geometry."""

    def __init__(self, role: str, geometry: kvshape.Geometry, options: Dict[str, Any]) -> None:
        self.role = role
        self.geometry = geometry
        self.options = options
        self.words: np.ndarray = np.empty(0, dtype=np.uint64)

    def prepare(self, seed: int) -> None:
        if self.role == "src":
            kvshape.fill_source(self.words, seed)
        else:
            self.words.fill(0)

    def poison(self) -> None:
        self.words.fill(0)

    def verify(self, seed: int) -> str:
        return kvshape.verify(self.words, self.geometry, seed)


class KvrailSide(Side):
    """kvrail: the pool is a HostBuffer registered with this node's kvraild as a paged KV region;
    a request is one Client.transfer with the two block tables (the daemon moves the bytes)."""

    def setup(self) -> Dict[str, Any]:
        import kvrail
        from kvrail.layouts import (ORDER_LAYER_PART_BLOCK_HND, ORDER_LAYER_PART_BLOCK_NHD,
                                    PagedLayout)
        g = self.geometry
        order = ORDER_LAYER_PART_BLOCK_HND if g.order == "HND" else ORDER_LAYER_PART_BLOCK_NHD
        heads = kvshape.HEADS if self.role == "src" else g.dst_heads
        self.layout = PagedLayout(num_layers=kvshape.LAYERS, num_parts=kvshape.PARTS,
                                  num_blocks=g.pool_blocks, tokens_per_block=g.tokens_per_block,
                                  num_heads=heads, head_dim=kvshape.HEAD_DIM, order=order)
        assert self.layout.nbytes == g.pool_bytes(self.role), "layout and geometry disagree"
        self.client = kvrail.connect(self.options["socket"])
        self.buffer = kvrail.HostBuffer(self.layout.nbytes, name=f"versus-{self.role}")
        self.words = self.buffer.ndarray("uint64")
        self.prepare(self.options["seed"])
        t0 = time.perf_counter()
        self.region = self.client.register_host_buffer(self.buffer, layout=self.layout,
                                                       writable=self.role == "dst")
        info: Dict[str, Any] = {"region": self.region.id}
        if self.role == "dst":
            node = self.options.get("peer_node", "")
            if node:  # another node's daemon writes here: Transfer.ExportRegion to that node
                self.region.export(node)
                info["node"] = self.options["node"]
            # The writer needs the owner's write grant, on this node and across nodes (the
            # receiving daemon checks it too).
            info["grant"] = self.region.grant(write=True, ttl=3600)
        return {"info": info, "register_s": time.perf_counter() - t0}

    def connect(self, peer: Dict[str, Any]) -> None:
        self.peer = peer
        self.src_ids, self.dst_ids = self.geometry.block_ids()

    def run(self, reps: int) -> Dict[str, Any]:
        g = self.geometry
        fields: Dict[str, Any] = {"timeout_ms": 600000}
        if "grant" in self.peer:
            fields["dst_grant"] = self.peer["grant"]
        if "node" in self.peer:
            fields["dst_node_id"] = self.peer["node"]
        if g.head_split:
            fields.update(src_head_begin=kvshape.SPLIT_HEAD, num_heads=1)
        seconds: List[float] = []
        phases: List[Dict[str, float]] = []
        for _ in range(reps):
            t0 = time.perf_counter()
            transfer = self.client.transfer(self.region, self.src_ids, self.peer["region"],
                                            self.dst_ids, **fields)
            status = transfer.result(timeout=600)
            seconds.append(time.perf_counter() - t0)
            if status.bytes_done != g.request_bytes:
                raise RuntimeError(f"kvrail moved {status.bytes_done} bytes, the request is "
                                   f"{g.request_bytes}")
            # The daemon's own clock: accept, queue and the move itself (microseconds).
            phases.append({"accept_us": status.submitted_unix_us - status.received_unix_us
                           if status.received_unix_us else 0,
                           "queue_us": status.started_unix_us - status.submitted_unix_us,
                           "move_us": status.finished_unix_us - status.started_unix_us})
        return {"seconds": seconds, "detail": {"engine": status.engine,
                                               "path": int(status.path), "phases": phases}}


class MooncakeSide(Side):
    """Mooncake Transfer Engine: P2PHANDSHAKE metadata (no metadata server), one registered
    buffer per pool; a request is one batch_transfer_sync_write of the merged descriptors (what
    its vLLM connector does)."""

    def setup(self) -> Dict[str, Any]:
        from mooncake.engine import TransferEngine
        g = self.geometry
        self.memory = _anon(g.pool_bytes(self.role))
        self.base = _address(self.memory)
        self.words = np.frombuffer(self.memory, dtype=np.uint64)
        self.prepare(self.options["seed"])
        t0 = time.perf_counter()
        self.engine = TransferEngine()
        rc = self.engine.initialize(self.options["ip"], "P2PHANDSHAKE",
                                    self.options.get("protocol", "tcp"), "")
        if rc != 0:
            raise RuntimeError(f"TransferEngine.initialize returned {rc}")
        rc = self.engine.register_memory(self.base, len(self.memory))
        if rc != 0:
            raise RuntimeError(f"register_memory returned {rc}")
        info = {"session": f"{self.options['ip']}:{self.engine.get_rpc_port()}",
                "base": self.base}
        return {"info": info, "register_s": time.perf_counter() - t0}

    def connect(self, peer: Dict[str, Any]) -> None:
        self.peer = peer
        self.src_off, self.dst_off, self.lengths = self.geometry.descriptors()
        # The handshake happens on the first transfer to a peer: a one-piece write makes it.
        rc = self.engine.transfer_sync_write(peer["session"], self.base, peer["base"], 8)
        if rc != 0:
            raise RuntimeError(f"transfer_sync_write (handshake) returned {rc}")

    def run(self, reps: int) -> Dict[str, Any]:
        seconds: List[float] = []
        for _ in range(reps):
            t0 = time.perf_counter()
            # Per request, as a connector does: the descriptor lists from the block tables.
            src = (self.src_off + self.base).tolist()
            dst = (self.dst_off + self.peer["base"]).tolist()
            rc = self.engine.batch_transfer_sync_write(self.peer["session"], src, dst,
                                                       self.lengths.tolist())
            seconds.append(time.perf_counter() - t0)
            if rc != 0:
                raise RuntimeError(f"batch_transfer_sync_write returned {rc}")
        return {"seconds": seconds, "detail": {"descriptors": len(self.lengths)}}


class NixlSide(Side):
    """NIXL with its UCX backend (UCX_TLS chooses the transport): each side registers its pool
    and prepares a descriptor list of every piece of the pool (vLLM's NIXL connector prepares
    per-block lists once); a request is make_prepped_xfer(WRITE, indices) + transfer + polling
    check_xfer_state until DONE."""

    def setup(self) -> Dict[str, Any]:
        from nixl_cu13 import nixl_agent, nixl_agent_config
        g = self.geometry
        self.memory = _anon(g.pool_bytes(self.role))
        self.base = _address(self.memory)
        self.words = np.frombuffer(self.memory, dtype=np.uint64)
        self.prepare(self.options["seed"])
        t0 = time.perf_counter()
        # The UCX backend as vLLM's connector makes it (num_threads 4), plus the variant's
        # parameters (UCX's shared-memory transports need ucx_error_handling_mode "none": they
        # have no peer failure handler, NIXL's default "peer" mode refuses them).
        params = {"num_threads": str(self.options.get("num_threads", 4))}
        params.update(self.options.get("nixl_params", {}))
        self.agent = nixl_agent(f"versus-{self.role}-{os.getpid()}",
                                nixl_agent_config(backends=[]))
        self.agent.create_backend("UCX", params)
        self.agent.register_memory([(self.base, len(self.memory), 0, "")], "DRAM")
        self.pieces = self._all_pieces()
        info: Dict[str, Any] = {"metadata": self.agent.get_agent_metadata().hex(),
                                "base": self.base}
        return {"info": info, "register_s": time.perf_counter() - t0}

    def _all_pieces(self) -> np.ndarray:
        """Every piece of this side's pool, (layer, part, block) order: an Nx3 descriptor array
        (address, length, device) of the units the request indexes."""
        g = self.geometry
        n = kvshape.LAYERS * kvshape.PARTS * g.pool_blocks
        heads = kvshape.HEADS if self.role == "src" else g.dst_heads
        offsets = np.arange(n, dtype=np.int64) * g.block_bytes(heads)
        if self.role == "src" and g.head_split:
            offsets += kvshape.SPLIT_HEAD * g.piece_bytes
        out = np.zeros((n, 3), dtype=np.int64)
        out[:, 0] = offsets + self.base
        out[:, 1] = g.piece_bytes
        return out

    def connect(self, peer: Dict[str, Any]) -> None:
        from nixl_cu13 import nixl_agent  # noqa: F401  (already loaded)
        self.peer = peer
        self.remote = self.agent.add_remote_agent(bytes.fromhex(peer["metadata"]))
        g = self.geometry
        remote = self._all_pieces()
        remote[:, 0] += peer["base"] - self.base
        if g.head_split:  # the remote (dst) pool holds one head: its own piece offsets
            n = len(remote)
            remote[:, 0] = np.arange(n, dtype=np.int64) * g.block_bytes(1) + peer["base"]
        self.local_list = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", self.pieces, "DRAM")
        self.remote_list = self.agent.prep_xfer_dlist(self.remote, remote, "DRAM")
        # Piece index = (layer * parts + part) * pool_blocks + block id.
        src_ids, dst_ids = g.block_ids()
        lp = np.arange(kvshape.LAYERS * kvshape.PARTS, dtype=np.int64)[:, None] * g.pool_blocks
        self.src_index = (lp + src_ids.astype(np.int64)).reshape(-1).astype(np.int32)
        self.dst_index = (lp + dst_ids.astype(np.int64)).reshape(-1).astype(np.int32)
        # UCX connects lazily: one small transfer makes the endpoint (part of the set-up).
        self._one(self.src_index[:1], self.dst_index[:1])

    def _one(self, local: np.ndarray, remote: np.ndarray) -> float:
        """One request; returns the seconds make_prepped_xfer took (the rest is post + poll)."""
        t0 = time.perf_counter()
        handle = self.agent.make_prepped_xfer("WRITE", self.local_list, local, self.remote_list,
                                              remote)
        made = time.perf_counter() - t0
        state = self.agent.transfer(handle)
        poll = float(self.options.get("poll_s", 0.0))
        while state == "PROC":
            if poll:
                time.sleep(poll)  # leave the CPU to the backend's progress thread
            state = self.agent.check_xfer_state(handle)
        self.agent.release_xfer_handle(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer ended in state {state}")
        return made

    def run(self, reps: int) -> Dict[str, Any]:
        seconds: List[float] = []
        made: List[float] = []
        for _ in range(reps):
            t0 = time.perf_counter()
            made.append(self._one(self.src_index, self.dst_index))
            seconds.append(time.perf_counter() - t0)
        return {"seconds": seconds, "detail": {"descriptors": len(self.src_index),
                                               "make_prepped_xfer_ms": 1e3 * max(made)}}


SYSTEMS = {"kvrail": KvrailSide, "mooncake": MooncakeSide, "nixl": NixlSide}


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # library prints go to the log, not the protocol pipe
    side = None
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        reply: Dict[str, Any] = {"ok": True}
        try:
            if op == "setup":
                geometry = kvshape.Geometry(request["kind"], request["blocks"], request["seed"])
                cls = SYSTEMS[request["system"]]
                side = cls(request["role"], geometry, dict(request["options"],
                                                           seed=request["seed"]))
                reply.update(side.setup())
            elif op == "connect":
                t0 = time.perf_counter()
                side.connect(request["peer"])
                reply["connect_s"] = time.perf_counter() - t0
            elif op == "poison":
                side.poison()
            elif op == "run":
                reply.update(side.run(int(request["reps"])))
            elif op == "verify":
                reply["mismatch"] = side.verify(int(request["seed"]))
            elif op == "quit":
                protocol.write(json.dumps(reply) + "\n")
                break
            else:
                raise ValueError(f"op: unknown {op!r}")
        except Exception as e:  # reported to the coordinator, which fails the row
            import traceback
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        protocol.write(json.dumps(reply) + "\n")
    protocol.close()
    os._exit(0)  # skip library destructors that may hang at interpreter exit


if __name__ == "__main__":
    main()
