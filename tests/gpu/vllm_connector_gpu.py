"""The kvrail vLLM connector's worker side on CUDA caches (GPU machine): registration of vLLM
0.33-shaped per-layer views ([blocks, heads, tokens, K|V] of one cudaMalloc allocation, LBNHC in
16-token blocks for the prefill, LBHNC in 32-token blocks for the decode) through register_cuda,
a decode pull checked byte for byte, the prefill's notification, the layer ready flags signalled
on a CUDA stream (GpuFlags) holding a pull until the prefill's stream marks its layers, and one
request's time through the connector vs client.transfer (32 layers).

vllm cannot be installed on the GPU machine (no network; its wheel exceeds what the device tool
carries), so the six vllm base classes kvrail.vllm subclasses are stood in for here; the scheduler
side and vLLM's own Scheduler are tested on the CPU (tests/vllm). Usage:
  python3 tests/gpu/vllm_connector_gpu.py --socket SOCK [--device 0]
"""
from __future__ import annotations

import abc
import argparse
import dataclasses
import enum
import statistics
import sys
import time
import types


def _stand_in_vllm() -> None:
    """Minimal stand-ins for vllm.distributed.kv_transfer.kv_connector.v1.base (what kvrail.vllm
    imports at module level)."""
    base = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")

    class KVConnectorBase_V1(abc.ABC):
        def __init__(self, vllm_config, role, kv_cache_config):
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role
            self._connector_metadata = None

        def bind_connector_metadata(self, meta):
            self._connector_metadata = meta

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    @dataclasses.dataclass
    class KVConnectorTransferResults:
        finished_sending: set = dataclasses.field(default_factory=set)
        finished_recving: set = dataclasses.field(default_factory=set)
        failed_recving: set = dataclasses.field(default_factory=set)

    base.KVConnectorBase_V1 = KVConnectorBase_V1
    base.KVConnectorRole = KVConnectorRole
    base.KVConnectorTransferResults = KVConnectorTransferResults
    base.KVConnectorHandshakeMetadata = type("KVConnectorHandshakeMetadata", (), {})
    base.KVConnectorMetadata = type("KVConnectorMetadata", (), {})
    base.KVConnectorWorkerMetadata = type("KVConnectorWorkerMetadata", (abc.ABC,), {})
    names = ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer",
             "vllm.distributed.kv_transfer.kv_connector",
             "vllm.distributed.kv_transfer.kv_connector.v1"]
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[base.__name__] = base


_stand_in_vllm()

import torch  # noqa: E402

import kvrail  # noqa: E402
import kvrail.vllm as kvv  # noqa: E402

NS = types.SimpleNamespace


def config(block_size: int, heads: int, head_dim: int, socket: str):
    vllm_config = NS(cache_config=NS(block_size=block_size),
                     parallel_config=NS(tensor_parallel_size=1),
                     kv_transfer_config=NS(kv_connector_extra_config={kvv.EXTRA_SOCKET: socket}))
    spec = NS(head_size=head_dim, head_size_v=head_dim)
    return vllm_config, NS(kv_cache_groups=[NS(kv_cache_spec=spec)])


def views(layers: int, blocks: int, heads: int, tokens: int, head_dim: int, hnd: bool,
          device: int):
    """vLLM 0.33's per-layer [B, H, N, C] views of one allocation (layer-major; C = 2*head_dim,
    fp16): LBNHC (tokens before heads) or LBHNC."""
    c = 2 * head_dim
    raw = torch.zeros(layers * blocks * heads * tokens * c, dtype=torch.float16,
                      device=f"cuda:{device}")
    page = heads * tokens * c
    strides = (page, tokens * c, c, 1) if hnd else (page, c, heads * c, 1)
    return {f"model.layers.{i}.self_attn.attn":
            torch.as_strided(raw, (blocks, heads, tokens, c), strides, i * blocks * page)
            for i in range(layers)}


def connector(name: str, caches, block_size: int, heads: int, head_dim: int, socket: str):
    vllm_config, kv_cache_config = config(block_size, heads, head_dim, socket)
    conn = kvv.KvrailConnector(vllm_config, kvv.KVConnectorRole.WORKER, kv_cache_config)
    conn.register_kv_caches(caches)
    return conn


def tokens_of(caches, blocks, block_size: int, count: int) -> torch.Tensor:
    """[count, layers, heads, C] of a request's tokens."""
    out = []
    for pos in range(count):
        b, s = blocks[pos // block_size], pos % block_size
        out.append(torch.stack([v[b, :, s, :] for v in caches.values()]))
    return torch.stack(out)


def params_for(prefill, req: str, blocks, tokens: int, epoch: int = 0) -> dict:
    return {"do_remote_prefill": True, "remote_request_id": req, "remote_block_ids": blocks,
            "remote_num_tokens": tokens, "remote_block_size": 16,
            "remote_blocks_expire_unix": time.time() + 600,
            "kvrail": {"epoch": epoch, "ranks": [prefill.get_handshake_metadata().as_params()]}}


def pull(decode, req: str, params: dict, local, tokens: int) -> None:
    meta = kvv.KvrailConnectorMetadata(0)
    meta.pulls.append(kvv.PullOrder(req_id=req, remote_request_id=params["remote_request_id"],
                                    params=params, local_block_ids=list(local), skip_tokens=0,
                                    num_tokens=tokens))
    decode.bind_connector_metadata(meta)
    decode.start_load_kv(None)
    decode.clear_connector_metadata()


def received(decode, req: str, timeout: float = 30.0) -> set:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        results = decode.get_transfer_results(set())
        if req in results.finished_recving:
            return results.failed_recving
        time.sleep(0.0005)
    raise AssertionError(f"{req}: not received in {timeout} s")


def send(prefill, req: str, ttl: float = 600.0) -> None:
    meta = kvv.KvrailConnectorMetadata(0)
    meta.sends[req] = ttl
    prefill.bind_connector_metadata(meta)
    prefill.start_load_kv(None)
    prefill.clear_connector_metadata()


def sent(prefill, req: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if req in prefill.get_transfer_results(set()).finished_sending:
            return True
        time.sleep(0.001)
    return False


def correctness(args) -> None:
    layers, heads, head_dim = 4, 2, 64
    pc = views(layers, 64, heads, 16, head_dim, hnd=False, device=args.device)
    dc = views(layers, 64, heads, 32, head_dim, hnd=True, device=args.device)
    p = connector("prefill", pc, 16, heads, head_dim, args.socket)
    d = connector("decode", dc, 32, heads, head_dim, args.socket)
    print("prefill layout", p._work().layout)
    print("decode layout ", d._work().layout)
    gen = torch.Generator(device=f"cuda:{args.device}").manual_seed(1)
    for v in pc.values():
        v.copy_(torch.randn(v.shape, generator=gen, device=v.device, dtype=torch.float16))
    torch.cuda.synchronize()
    src_blocks, dst_blocks, n = [9, 3, 40, 17, 22], [5, 30, 12], 75  # partial last blocks
    send(p, "r1")
    pull(d, "r1", params_for(p, "r1", src_blocks, n), dst_blocks, n)
    assert not received(d, "r1"), "the pull failed"
    torch.cuda.synchronize()
    assert torch.equal(tokens_of(dc, dst_blocks, 32, n), tokens_of(pc, src_blocks, 16, n))
    tail = torch.stack([v[12, :, 75 - 64:, :] for v in dc.values()])
    assert (tail == 0).all(), "bytes past the request's last token were written"
    assert sent(p, "r1"), "no notification reached the prefill"
    print("ok  pull byte for byte (NHD/16 -> HND/32, 75 tokens), prefill notified")
    # Layer streaming: the prefill's stream marks the layers after a long kernel.
    stream = torch.cuda.Stream(device=args.device)
    epoch = 7
    pw = p._work()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the marks
        pw.mark_all_layers(epoch)
    pull(d, "r2", params_for(p, "r2", src_blocks, n, epoch=epoch), [1, 2, 3], n)
    status = [t for t in d._work().client.list_transfers(label="vllm r2")][0]
    early = status.state
    assert not received(d, "r2"), "the streamed pull failed"
    stream.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(tokens_of(dc, [1, 2, 3], 32, n), tokens_of(pc, src_blocks, 16, n))
    print(f"ok  streamed pull waited for the GPU-signalled layer flags (state at submit "
          f"{kvrail.transfer_pb2.TransferState.Name(early)})")
    p.shutdown()
    d.shutdown()


def overhead(args) -> None:
    layers, heads, head_dim, n = 32, 8, 128, 1000
    blocks = 72
    pc = views(layers, blocks, heads, 16, head_dim, hnd=False, device=args.device)
    dc = views(layers, blocks, heads, 16, head_dim, hnd=False, device=args.device)
    p = connector("prefill", pc, 16, heads, head_dim, args.socket)
    d = connector("decode", dc, 16, heads, head_dim, args.socket)
    dw = d._work()
    nbytes = n * layers * 2 * heads * head_dim * 2
    src_blocks = list(range(1, 64))
    dst_blocks = list(range(70, 7, -1))[:63]
    times = {"api": [], "connector": []}
    for i in range(args.runs + 1):
        params = params_for(p, f"o{i}", src_blocks, n)
        src = params["kvrail"]["ranks"][0]
        t0 = time.perf_counter()
        dw.client.transfer(src["region_id"], src_blocks, dw.region, dst_blocks, num_tokens=n,
                           src_grant=src["grant"]).result(timeout=60)
        t_api = time.perf_counter() - t0
        t0 = time.perf_counter()
        pull(d, f"o{i}", params, dst_blocks, n)
        assert not received(d, f"o{i}")
        t_conn = time.perf_counter() - t0
        if i:
            times["api"].append(t_api)
            times["connector"].append(t_conn)
    engine = [t.engine for t in dw.client.list_transfers(label=f"vllm o{args.runs}")]
    print(f"one request: {n} tokens x {layers} layers x {heads} KV heads x {head_dim} fp16 = "
          f"{nbytes / 2**20:.1f} MiB, GPU{args.device} -> GPU{args.device}, engine {engine}, "
          f"{args.runs} runs")
    print(f"{'path':<10} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'GB/s':>7}")
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"{name:<10} {med * 1e3:>10.3f} {min(xs) * 1e3:>8.3f} {max(xs) * 1e3:>8.3f} "
              f"{nbytes / med / 1e9:>7.1f}")
    p.shutdown()
    d.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    torch.cuda.set_device(args.device)
    correctness(args)
    overhead(args)


if __name__ == "__main__":
    main()
