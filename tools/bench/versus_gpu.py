#!/usr/bin/env python3
"""Scenario C of the versus benchmark (tools/bench/versus.py): paged KV in GPU memory, GPU0 -> GPU0
and GPU0 -> GPU1, on the GPU machine (Python 3.12 + torch there; no Bazel, no PyPI).

The same request shapes as scenarios A and B (tools/bench/versus/kvshape.py: 32 layers, K and V,
8 KV heads, head_dim 128, bf16; pieces of 4 KiB = one head of an HND block, 32 KiB = a 16-token
NHD block, 256 KiB = a 128-token NHD block), in torch tensors:
  kvrail    kvraild (CUDA engine, its defaults) moves the blocks: both pools registered as paged
            regions (kvrail.tensors.register_tensor, CUDA IPC), one Client.transfer with the two
            block tables, timed submit -> result() in the client.
  nixl      NIXL UCX (UCX_TLS=cuda_ipc,cuda_copy,sm,self; VERSUS_UCX_TLS overrides), one agent per
            process, descriptors per piece prepared once, make_prepped_xfer(WRITE) + polling.
  nccl      GPU0 -> GPU1 only (NCCL refuses two ranks on one GPU): rank 0 packs the pieces with
            index_select into one buffer, send/recv, rank 1 unpacks with index_copy_ (what a
            PyTorch server does without a KV transport), timed from a barrier to the unpack done.
  torch     one process, gather + scatter by advanced indexing (dst[.., ids] = src[.., ids]):
            the nearest thing to a same-GPU move without a transport library.
  ceiling   the copy engine's contiguous copy of the same byte count (dst.copy_(src) of flat
            buffers): the rate scattered moves are judged against.
  mooncake  Mooncake Transfer Engine, protocol nvlink_intra (VERSUS_MOONCAKE_PROTOCOL overrides),
            P2PHANDSHAKE, one engine per process, one batch_transfer_sync_write of the merged
            descriptors per request (its vLLM connector's call).
NIXL and Mooncake rows need their modules importable on the GPU machine (no PyPI there):
tools/bench/versus/pack_peers.sh packs the pinned cp312 wheels (nixl-cu13 1.5.1,
mooncake-transfer-engine-cuda13 0.3.14), trimmed to what this script loads, into one 27 MiB bundle
(.gpucarry/peers.tar.xz) that rides beside the GPU pack; tests/gpu/run.sh's `versus` step unpacks
it onto PYTHONPATH. A row whose module does not import says so and is not a result.
Every row compares the destination blocks with the source blocks (torch.equal) after the warm-up
and after the last timed request; a row that does not match prints FAILED.

Run on the GPU machine from a devpack (tests/gpu/pack.sh puts kvraild, libkvrail.so and the
Python package with its generated protos in .devpack/):
  export LD_LIBRARY_PATH=$PWD/.devpack/lib:$LD_LIBRARY_PATH
  PYTHONPATH=$PWD/.devpack/py KVRAIL_LIB=$PWD/.devpack/bin/libkvrail.so \\
    /opt/torch/.venv/bin/python3 tools/bench/versus_gpu.py --kvraild .devpack/bin/kvraild
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "versus"))
import kvshape  # noqa: E402

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on the lent machines
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

MIB = 1 << 20


def pools(torch, g: kvshape.Geometry, src_dev: str, dst_dev: str, seed: int):
    """(src, dst) pool tensors, [L, P, B, T, H, D] (NHD) or [L, P, B, H, T, D] (HND), bf16; the
    source holds word i = i * K + seed (int64 view), the destination zeros."""
    tpb, heads = g.tokens_per_block, kvshape.HEADS
    inner = (heads, tpb) if g.order == "HND" else (tpb, heads)
    dinner = (g.dst_heads, tpb) if g.order == "HND" else (tpb, g.dst_heads)
    shape = (kvshape.LAYERS, kvshape.PARTS, g.pool_blocks) + inner + (kvshape.HEAD_DIM,)
    dshape = (kvshape.LAYERS, kvshape.PARTS, g.pool_blocks) + dinner + (kvshape.HEAD_DIM,)
    src = torch.empty(shape, dtype=torch.bfloat16, device=src_dev)
    words = src.view(-1).view(torch.int64)
    words.copy_(torch.arange(words.numel(), dtype=torch.int64, device=src_dev))
    words.mul_(int(kvshape.PATTERN_K.astype("int64"))).add_(seed)
    dst = torch.zeros(dshape, dtype=torch.bfloat16, device=dst_dev)
    return src, dst


def moved(torch, g: kvshape.Geometry, pool, ids, side: str):
    """The request's pieces of a pool, [L, P, n, ...] (the head of a split on the source)."""
    picked = pool.index_select(2, torch.as_tensor(ids.astype("int64"), device=pool.device))
    if g.head_split and side == "src":
        picked = picked[:, :, :, kvshape.SPLIT_HEAD:kvshape.SPLIT_HEAD + 1]
    return picked


def check(torch, g, src, dst) -> str:
    s_ids, d_ids = g.block_ids()
    a = moved(torch, g, src, s_ids, "src").to(dst.device)
    b = moved(torch, g, dst, d_ids, "dst")
    return "" if torch.equal(a.view(torch.int16), b.view(torch.int16)) else \
        "destination blocks differ from the source blocks"


def timed(torch, fn: Callable[[], None], reps: int, sync: Callable[[], None]) -> List[float]:
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


# --- rows --------------------------------------------------------------------------------------
def row_torch(torch, g, src_dev, dst_dev, reps, seed, ceiling=False) -> Dict[str, Any]:
    src, dst = pools(torch, g, src_dev, dst_dev, seed)
    s_ids, d_ids = g.block_ids()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    if ceiling:
        a = src.view(-1)[: g.request_bytes // 2]
        b = dst.view(-1)[: g.request_bytes // 2] if dst.numel() * 2 >= g.request_bytes else \
            torch.empty_like(a, device=dst_dev)
        seconds = timed(torch, lambda: b.copy_(a, non_blocking=True), reps + 1, sync)[1:]
        ok = "" if torch.equal(a.to(b.device).view(torch.int16), b.view(torch.int16)) else \
            "contiguous copy differs"
        return {"seconds": seconds, "mismatch": ok}
    si = torch.as_tensor(s_ids.astype("int64"), device=src_dev)
    di = torch.as_tensor(d_ids.astype("int64"), device=dst_dev)

    def move():
        picked = src.index_select(2, si)
        if g.head_split:
            picked = picked[:, :, :, kvshape.SPLIT_HEAD:kvshape.SPLIT_HEAD + 1]
        dst.index_copy_(2, di, picked.to(dst_dev, non_blocking=True))

    move()
    sync()
    bad = check(torch, g, src, dst)
    seconds = timed(torch, move, reps, sync)
    return {"seconds": seconds, "mismatch": bad or check(torch, g, src, dst)}


def row_kvrail(torch, g, src_dev, dst_dev, reps, seed, socket_path) -> Dict[str, Any]:
    import kvrail
    from kvrail.tensors import register_tensor
    src, dst = pools(torch, g, src_dev, dst_dev, seed)
    torch.cuda.synchronize()
    s_ids, d_ids = g.block_ids()
    axes = "LPBHTD" if g.order == "HND" else "LPBTHD"
    fields: Dict[str, Any] = {"timeout_ms": 600000}
    if g.head_split:
        fields.update(src_head_begin=kvshape.SPLIT_HEAD, num_heads=1)
    with kvrail.connect(socket_path) as client:
        t0 = time.perf_counter()
        a = register_tensor(client, src, layout=axes, writable=False)
        b = register_tensor(client, dst, layout=axes, writable=True)
        setup = time.perf_counter() - t0

        def move():
            status = client.transfer(a, s_ids, b, d_ids, **fields).result(timeout=600)
            if status.bytes_done != g.request_bytes:
                raise RuntimeError(f"kvrail moved {status.bytes_done} of {g.request_bytes} bytes")

        move()
        bad = check(torch, g, src, dst)
        dst.zero_()
        torch.cuda.synchronize()
        seconds = timed(torch, move, reps, lambda: None)
        bad = bad or check(torch, g, src, dst)
    return {"seconds": seconds, "mismatch": bad, "setup_ms": setup * 1e3}


def _put(conn, value: Any) -> None:
    """JSON over a multiprocessing pipe's byte channel (no pickled data between processes)."""
    conn.send_bytes(json.dumps(value).encode())


def _get(conn) -> Any:
    return json.loads(conn.recv_bytes())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nccl_rank(rank: int, kind: str, blocks: int, reps: int, seed: int, port: int, conn) -> None:
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    g = kvshape.Geometry(kind, blocks, seed)
    src, dst = pools(torch, g, f"cuda:{rank}", f"cuda:{rank}", seed)
    s_ids, d_ids = g.block_ids()
    si = torch.as_tensor(s_ids.astype("int64"), device=f"cuda:{rank}")
    di = torch.as_tensor(d_ids.astype("int64"), device=f"cuda:{rank}")
    shape = moved(torch, g, src, s_ids, "src").shape
    buf = torch.empty(shape, dtype=torch.bfloat16, device=f"cuda:{rank}")

    def move():
        if rank == 0:
            picked = src.index_select(2, si)
            if g.head_split:
                picked = picked[:, :, :, kvshape.SPLIT_HEAD:kvshape.SPLIT_HEAD + 1]
            buf.copy_(picked)
            dist.send(buf, 1)
        else:
            dist.recv(buf, 0)
            dst.index_copy_(2, di, buf)
        torch.cuda.synchronize()

    seconds = []
    for rep in range(reps + 1):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        move()
        dist.barrier()
        seconds.append(time.perf_counter() - t0)
        if rank == 1 and rep in (0, reps):  # rank 1's own source pool is the same pattern
            bad = check(torch, g, src, dst)
            if bad:
                _put(conn, {"seconds": [], "mismatch": bad})
                dist.destroy_process_group()
                return
            dst.zero_()
    if rank == 1:
        _put(conn, {"seconds": seconds[1:], "mismatch": ""})
    dist.destroy_process_group()


def row_nccl(torch, g, reps, seed) -> Dict[str, Any]:
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    port = _free_port()
    procs = [ctx.Process(target=_nccl_rank, args=(r, g.kind, g.blocks, reps, seed, port, theirs))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        if not mine.poll(600):
            raise RuntimeError("the NCCL ranks gave no result in 600 s")
        result = _get(mine)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
    return result


def _nixl_side(role: str, kind: str, blocks: int, seed: int, device: int, conn, reps: int) -> None:
    """One NIXL agent (a process): registers its pool, exchanges metadata over `conn`."""
    import numpy as np
    import torch
    from nixl_cu13 import nixl_agent, nixl_agent_config
    g = kvshape.Geometry(kind, blocks, seed)
    torch.cuda.set_device(device)
    dev = f"cuda:{device}"
    src, dst = pools(torch, g, dev, dev, seed)
    pool = src if role == "src" else dst
    agent = nixl_agent(f"versus-{role}-{os.getpid()}", nixl_agent_config(backends=[]))
    agent.create_backend("UCX", {"num_threads": "4", "ucx_error_handling_mode": "none"})
    t0 = time.perf_counter()
    agent.register_memory([(pool.data_ptr(), pool.numel() * 2, device, "")], "VRAM")
    heads = kvshape.HEADS if role == "src" else g.dst_heads
    n = kvshape.LAYERS * kvshape.PARTS * g.pool_blocks
    pieces = np.zeros((n, 3), dtype=np.int64)
    pieces[:, 0] = np.arange(n, dtype=np.int64) * g.block_bytes(heads) + pool.data_ptr()
    if role == "src" and g.head_split:
        pieces[:, 0] += kvshape.SPLIT_HEAD * g.piece_bytes
    pieces[:, 1] = g.piece_bytes
    pieces[:, 2] = device
    _put(conn, {"metadata": agent.get_agent_metadata().hex(), "pieces": pieces.tobytes().hex()})
    peer = _get(conn)
    if role == "dst":
        _get(conn)  # "done" from the source: the bytes have landed
        _put(conn, {"mismatch": check(torch, g, src, dst)})
        _get(conn)
        return
    remote = agent.add_remote_agent(bytes.fromhex(peer["metadata"]))
    local_list = agent.prep_xfer_dlist("NIXL_INIT_AGENT", pieces, "VRAM")
    remote_list = agent.prep_xfer_dlist(
        remote, np.frombuffer(bytes.fromhex(peer["pieces"]), dtype=np.int64).reshape(-1, 3),
        "VRAM")
    setup = time.perf_counter() - t0
    s_ids, d_ids = g.block_ids()
    lp = np.arange(kvshape.LAYERS * kvshape.PARTS, dtype=np.int64)[:, None] * g.pool_blocks
    li = (lp + s_ids.astype(np.int64)).reshape(-1).astype(np.int32)
    ri = (lp + d_ids.astype(np.int64)).reshape(-1).astype(np.int32)
    seconds = []
    for _ in range(reps + 1):
        t1 = time.perf_counter()
        handle = agent.make_prepped_xfer("WRITE", local_list, li, remote_list, ri)
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        agent.release_xfer_handle(handle)
        seconds.append(time.perf_counter() - t1)
        if state != "DONE":
            _put(conn, {"error": f"NIXL state {state}"})
            return
    _put(conn, {"seconds": seconds[1:], "setup_ms": setup * 1e3})


def row_nixl(torch, g, src_gpu: int, dst_gpu: int, reps: int, seed: int) -> Dict[str, Any]:
    os.environ["UCX_TLS"] = os.environ.get("VERSUS_UCX_TLS", "cuda_ipc,cuda_copy,sm,self")
    return row_pair(_nixl_side, "nixl_cu13", g, src_gpu, dst_gpu, reps, seed)


def _mooncake_side(role: str, kind: str, blocks: int, seed: int, device: int, conn,
                   reps: int) -> None:
    """One Mooncake TransferEngine (a process), protocol $VERSUS_MOONCAKE_PROTOCOL (default
    nvlink_intra), P2PHANDSHAKE; the pool registered at location cuda:<device>."""
    import numpy as np
    import torch
    from mooncake.engine import TransferEngine
    g = kvshape.Geometry(kind, blocks, seed)
    torch.cuda.set_device(device)
    dev = f"cuda:{device}"
    src, dst = pools(torch, g, dev, dev, seed)
    pool = src if role == "src" else dst
    t0 = time.perf_counter()
    engine = TransferEngine()
    protocol = os.environ.get("VERSUS_MOONCAKE_PROTOCOL", "nvlink_intra")
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") != 0:
        _put(conn, {"error": f"TransferEngine.initialize({protocol}) failed"})
        return
    if engine.register_memory(pool.data_ptr(), pool.numel() * 2, f"cuda:{device}") != 0:
        _put(conn, {"error": "register_memory failed"})
        return
    _put(conn, {"session": f"127.0.0.1:{engine.get_rpc_port()}", "base": pool.data_ptr()})
    peer = _get(conn)
    if role == "dst":
        _get(conn)
        _put(conn, {"mismatch": check(torch, g, src, dst)})
        _get(conn)
        return
    setup = time.perf_counter() - t0
    s_off, d_off, lengths = g.descriptors()
    seconds = []
    for _ in range(reps + 1):
        t1 = time.perf_counter()
        rc = engine.batch_transfer_sync_write(peer["session"], (s_off + pool.data_ptr()).tolist(),
                                              (d_off + peer["base"]).tolist(), lengths.tolist())
        seconds.append(time.perf_counter() - t1)
        if rc != 0:
            _put(conn, {"error": f"batch_transfer_sync_write returned {rc}"})
            return
    _put(conn, {"seconds": seconds[1:], "setup_ms": setup * 1e3})


def row_pair(side, module: str, g, src_gpu: int, dst_gpu: int, reps: int,
             seed: int) -> Dict[str, Any]:
    """A source and a destination process running `side`, their hand-shake relayed as JSON."""
    try:
        __import__(module)
    except ImportError as e:
        return {"skip": f"{module} does not import here ({e})"}
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    a_conn, a_peer = ctx.Pipe()
    b_conn, b_peer = ctx.Pipe()
    pa = ctx.Process(target=side, args=("src", g.kind, g.blocks, seed, src_gpu, a_peer, reps))
    pb = ctx.Process(target=side, args=("dst", g.kind, g.blocks, seed, dst_gpu, b_peer, reps))
    pa.start()
    pb.start()
    try:
        for c in (a_conn, b_conn):
            if not c.poll(300):
                raise RuntimeError("a side gave no hand-shake in 300 s")
        ma, mb = _get(a_conn), _get(b_conn)
        if "error" in ma or "error" in mb:
            return {"error": ma.get("error") or mb.get("error")}
        _put(a_conn, mb)
        _put(b_conn, ma)
        if not a_conn.poll(600):
            raise RuntimeError("the source gave no result in 600 s")
        result = _get(a_conn)
        _put(b_conn, "done")
        checked = _get(b_conn)
        _put(b_conn, "bye")
        result["mismatch"] = result.get("error", "") or checked["mismatch"]
        return result
    finally:
        for p in (pa, pb):
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()


def start_kvraild(path: str, folder: str) -> Tuple[subprocess.Popen, str]:
    sock = os.path.join(folder, "kvrail.sock")
    log = open(os.path.join(folder, "kvraild.log"), "wb")
    daemon = subprocess.Popen([path, "--socket", sock, "--log-level", "warn"], stdout=log,
                              stderr=log)
    import kvrail
    for _ in range(200):
        if daemon.poll() is not None:
            raise RuntimeError(f"kvraild exited {daemon.returncode} (log {folder}/kvraild.log)")
        try:
            with kvrail.connect(sock) as c:
                c.stats()
            return daemon, sock
        except Exception:
            time.sleep(0.1)
    raise RuntimeError("kvraild did not answer in 20 s")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The peers for the GPU machine: tools/bench/versus/pack_peers.sh (see above).")
    p.add_argument("--kvraild", default=".devpack/bin/kvraild")
    p.add_argument("--pairs", default="0-0,0-1", help="GPU pairs src-dst")
    p.add_argument("--kinds", default="4k,32k,256k")
    p.add_argument("--systems", default="kvrail,mooncake,nixl,nccl,torch,ceiling")
    p.add_argument("--mib", type=int, default=512, help="throughput request size")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--lat-reps", type=int, default=50)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("versus_gpu: no CUDA device (scenario C runs on the GPU machine)", file=sys.stderr)
        return 2
    systems = args.systems.split(",")
    folder = tempfile.mkdtemp(prefix="kvrail-versus-gpu-")
    daemon, sock = start_kvraild(args.kvraild, folder) if "kvrail" in systems else (None, "")
    failed = 0
    try:
        print(f"versus_gpu: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
              f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}, "
              f"torch {torch.__version__}")
        for pair in args.pairs.split(","):
            a, b = (int(x) for x in pair.split("-"))
            if max(a, b) >= torch.cuda.device_count():
                print(f"\nGPU{a} -> GPU{b}: not here ({torch.cuda.device_count()} GPU(s))")
                continue
            for latency in (False, True):
                print(f"\nGPU{a} -> GPU{b}, {'16 MiB latency (ms p50 / p99)' if latency else f'{args.mib} MiB requests, GB/s median [min-max]'}")
                print("| piece | system | figure | kvrail / row | verified |")
                print("|---|---|---|---|---|")
                for kind in args.kinds.split(","):
                    piece = kvshape.Geometry(kind, 1).piece_bytes * kvshape.LAYERS * kvshape.PARTS
                    blocks = max(1, (16 * MIB if latency else args.mib * MIB) // piece)
                    g = kvshape.Geometry(kind, blocks, args.seed)
                    reps = args.lat_reps if latency else args.reps
                    results: Dict[str, Dict[str, Any]] = {}
                    for system in systems:
                        try:
                            if system == "kvrail":
                                r = row_kvrail(torch, g, f"cuda:{a}", f"cuda:{b}", reps,
                                               args.seed, sock)
                            elif system == "torch":
                                r = row_torch(torch, g, f"cuda:{a}", f"cuda:{b}", reps, args.seed)
                            elif system == "ceiling":
                                r = row_torch(torch, g, f"cuda:{a}", f"cuda:{b}", reps, args.seed,
                                              ceiling=True)
                            elif system == "nccl":
                                r = {"skip": "NCCL needs two GPUs (one rank per GPU)"} if a == b \
                                    else row_nccl(torch, g, reps, args.seed)
                            elif system == "nixl":
                                r = row_nixl(torch, g, a, b, reps, args.seed)
                            elif system == "mooncake":
                                r = row_pair(_mooncake_side, "mooncake.engine", g, a, b, reps,
                                             args.seed)
                            else:
                                r = {"skip": f"unknown system {system}"}
                        except Exception as e:
                            r = {"error": f"{type(e).__name__}: {e}"}
                        torch.cuda.empty_cache()
                        results[system] = r
                    kv = results.get("kvrail", {})
                    for system, r in results.items():
                        if "skip" in r:
                            print(f"| {kind} | {system} | not run: {r['skip']} | - | - |")
                            continue
                        if r.get("error") or r.get("mismatch") or not r.get("seconds"):
                            failed += 1
                            print(f"| {kind} | {system} | FAILED: "
                                  f"{r.get('error') or r.get('mismatch') or 'no timing'} | - | no |")
                            continue
                        s = sorted(r["seconds"])
                        if latency:
                            ms = [1e3 * x for x in s]
                            fig = f"{statistics.median(ms):.3f} / {ms[min(len(ms) - 1, int(0.99 * len(ms)))]:.3f}"
                            val = statistics.median(ms)
                            kvv = statistics.median(kv["seconds"]) * 1e3 if kv.get("seconds") else None
                            ratio = f"{val / kvv:.2f}x" if kvv and system != "kvrail" else "-"
                        else:
                            gb = [g.request_bytes / x / 1e9 for x in s]
                            fig = f"{statistics.median(gb):.1f} [{min(gb):.1f}-{max(gb):.1f}]"
                            kvg = (g.request_bytes / statistics.median(kv["seconds"]) / 1e9
                                   if kv.get("seconds") else None)
                            ratio = f"{kvg / statistics.median(gb):.2f}x" \
                                if kvg and system != "kvrail" else "-"
                        print(f"| {kind} | {system} | {fig} | {ratio} | yes |", flush=True)
    finally:
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
