#!/usr/bin/env python3
"""Per-layer regions on the GPU machine: correctness of per-layer CUDA regions (one
torch tensor per layer, vLLM's shape) in both directions and against per-layer host memory,
then one request of a 32-layer, 4,096-token pool moved as one transfer vs 32 per-layer
transfers (the same daemon, the same blocks, interleaved rounds). Prints a table.

  per_layer_gpu.py --socket SOCK
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch

import kvrail
from kvrail.tensors import register_kv_cache, register_tensor

SUCCEEDED = kvrail.transfer_pb2.TRANSFER_STATE_SUCCEEDED


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def correctness(client) -> None:
    layers, blocks, tpb, heads, dim = 6, 64, 16, 8, 128
    # Source: one tensor per layer, vLLM NHD [2, blocks, tpb, heads, dim].
    src = [torch.randn((2, blocks, tpb, heads, dim), dtype=torch.bfloat16, device="cuda:0")
           for _ in range(layers)]
    # Destination: one stacked tensor, HND with 32-token blocks [L, 2, blocks, heads, 32, dim].
    dst = torch.zeros((layers, 2, blocks // 2, heads, 32, dim), dtype=torch.bfloat16,
                      device="cuda:0")
    src_region = register_kv_cache(client, src, "vllm_nhd", writable=False, name="per-layer src")
    dst_region = register_tensor(client, dst, layout="LPBHTD", writable=True, name="stacked dst")
    check(len(src_region.info.spec.layer_shares) == layers, "one region over 6 layer tensors")
    src_blocks = [(5 * i + 3) % blocks for i in range(8)]  # 128 tokens
    dst_blocks = [30, 2, 17, 9]
    t = client.transfer(src_region, src_blocks, dst_region, dst_blocks)
    status = t.result(timeout=30)
    torch.cuda.synchronize()
    got = dst[:, :, dst_blocks].permute(0, 1, 2, 4, 3, 5).reshape(layers, 2, 128, heads, dim)
    want = torch.stack([s[:, src_blocks].reshape(2, 128, heads, dim) for s in src])
    check(torch.equal(got, want), f"per-layer CUDA -> stacked CUDA, NHD 16 -> HND 32 "
          f"({status.engine}, {status.bytes_total} bytes)")
    untouched = [b for b in range(blocks // 2) if b not in dst_blocks]
    check(int(dst[:, :, untouched].abs().sum()) == 0, "destination blocks outside the table untouched")

    # Back: stacked -> per-layer, layers 2..4 of the stacked pool into per-layer layers 0..2.
    back = [torch.zeros_like(s) for s in src]
    back_region = register_kv_cache(client, back, "vllm_nhd", writable=True, name="per-layer dst")
    client.transfer(dst_region, [30, 2], back_region, [7, 40, 1, 63], num_layers=3,
                    src_layer_begin=2).result(timeout=30)
    torch.cuda.synchronize()
    for layer in range(3):
        want = dst[layer + 2, :, [30, 2]].permute(0, 1, 3, 2, 4).reshape(2, 64, heads, dim)
        got = back[layer][:, [7, 40, 1, 63]].reshape(2, 64, heads, dim)
        check(torch.equal(got, want), f"stacked -> per-layer layer {layer} (layer range)")
    check(all(int(b.abs().sum()) == 0 for b in back[3:]), "per-layer layers outside the range untouched")

    # Host per-layer -> GPU per-layer (pinned layer mappings, one table per accessor).
    one = kvrail.PagedLayout(num_layers=1, num_parts=2, num_blocks=blocks, tokens_per_block=tpb,
                             num_heads=heads, head_dim=dim)
    layout = dataclasses.replace(one, num_layers=layers)
    buffers = [kvrail.HostBuffer(one.nbytes, f"host layer {i}") for i in range(layers)]
    rng = np.random.default_rng(7)
    for b in buffers:
        b.ndarray(np.uint16)[:] = rng.integers(0, 1 << 16, size=one.nbytes // 2, dtype=np.uint16)
    host_region = client.register_host_layers(buffers, layout, name="host per-layer")
    gpu = [torch.zeros((2, blocks, tpb, heads, dim), dtype=torch.bfloat16, device="cuda:0")
           for _ in range(layers)]
    gpu_region = register_kv_cache(client, gpu, "vllm_nhd", writable=True, name="gpu per-layer")
    status = client.transfer(host_region, [0, 9, 33], gpu_region, [4, 5, 6]).result(timeout=30)
    torch.cuda.synchronize()
    ok = True
    for layer in range(layers):
        host = torch.from_numpy(buffers[layer].paged_view(one)[0].copy().view(np.int16))
        want = host[:, [0, 9, 33]]
        got = gpu[layer][:, [4, 5, 6]].cpu().view(torch.int16)
        ok = ok and torch.equal(got, want)
    check(ok, f"host per-layer -> GPU per-layer ({status.engine}, path {status.path})")


def bench(client, rounds: int) -> None:
    layers, tokens, tpb, heads, dim = 32, 4096, 16, 8, 128
    blocks = tokens // tpb
    pool = 2 * blocks
    src = [torch.randn((2, pool, tpb, heads, dim), dtype=torch.bfloat16, device="cuda:0")
           for _ in range(layers)]
    dst = [torch.zeros_like(s) for s in src]
    src_blocks = [(7 * i + 3) % pool for i in range(blocks)]
    dst_blocks = [pool - 1 - 2 * i for i in range(blocks)]
    one_src = register_kv_cache(client, src, "vllm_nhd", writable=False, name="bench src")
    one_dst = register_kv_cache(client, dst, "vllm_nhd", writable=True, name="bench dst")
    per_src = [register_tensor(client, s, layout="PBTHD", writable=False) for s in src]
    per_dst = [register_tensor(client, d, layout="PBTHD", writable=True) for d in dst]

    def one_transfer() -> float:
        t0 = time.perf_counter()
        client.transfer(one_src, src_blocks, one_dst, dst_blocks).result(timeout=60)
        return time.perf_counter() - t0

    def per_layer_transfers() -> float:
        t0 = time.perf_counter()
        ts = [client.transfer(per_src[l], src_blocks, per_dst[l], dst_blocks)
              for l in range(layers)]
        for t in ts:
            t.result(timeout=60)
        return time.perf_counter() - t0

    one_transfer(), per_layer_transfers()  # warm-up (plans, mappings, tuner)
    a, b = [], []
    for _ in range(rounds):
        a.append(one_transfer())
        b.append(per_layer_transfers())
    torch.cuda.synchronize()
    ok = all(torch.equal(d[:, dst_blocks], s[:, src_blocks]) for s, d in zip(src, dst))
    check(ok, "benchmark bytes landed")
    nbytes = layers * 2 * tokens * heads * dim * 2
    print(f"one request: {layers} layers x {tokens} tokens (8 KV heads, head_dim 128, bf16, "
          f"16-token blocks) = {nbytes / 2**20:.0f} MiB, GPU0 -> GPU0, {rounds} rounds")
    print("| method | median ms | min ms | GB/s (median) |")
    print("|---|---|---|---|")
    for name, xs in (("one transfer over per-layer regions", a),
                     (f"{layers} per-layer transfers (submit all, then wait)", b)):
        med = statistics.median(xs)
        print(f"| {name} | {med * 1e3:.3f} | {min(xs) * 1e3:.3f} | {nbytes / med / 1e9:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--correctness-only", action="store_true")
    args = parser.parse_args()
    with kvrail.connect(args.socket) as client:
        correctness(client)
        if not args.correctness_only:
            bench(client, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
