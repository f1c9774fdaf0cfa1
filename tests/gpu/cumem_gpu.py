#!/usr/bin/env python3
"""cuMem (VMM) regions on the GPU machine: torch tensors from the
expandable_segments allocator (cuMem memory, which cudaIpcGetMemHandle refuses) registered with
kvrail - exported as POSIX fds over the session socket, imported and mapped by kvraild - then
moved and checked byte for byte, single and per-layer, small and spanning many cuMem chunks.
Run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.

  cumem_gpu.py --socket SOCK
"""
from __future__ import annotations

import argparse
import os
import time

import torch

import kvrail
from kvrail.tensors import register_kv_cache, register_tensor


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def legacy_ipc_refuses(t) -> bool:
    """Whether cudaIpcGetMemHandle refuses the tensor's memory (cuda-bindings; True when that
    package is missing: the share kind checked below still says which path ran)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime
        except ImportError:
            return True
    err, _ = runtime.cudaIpcGetMemHandle(t.data_ptr())
    return int(err) != 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    check("expandable_segments:True" in conf, f"torch allocator: {conf}")
    with kvrail.connect(args.socket) as client:
        # 1 GiB pools: [2, 4096 blocks, 16 tokens, 8 heads, 128] bf16 (spans many cuMem chunks).
        shape = (2, 4096, 16, 8, 128)
        src = torch.randn(shape, dtype=torch.bfloat16, device="cuda:0")
        dst = torch.zeros(shape, dtype=torch.bfloat16, device="cuda:0")
        check(legacy_ipc_refuses(src), "cudaIpcGetMemHandle refuses the expandable-segments tensor")
        src_region = register_tensor(client, src, layout="PBTHD", writable=False, name="vmm src")
        dst_region = register_tensor(client, dst, layout="PBTHD", writable=True, name="vmm dst")
        share = src_region.info.spec.share
        check(share.WhichOneof("via") == "cuda_vmm",
              f"shared as cuMem fds: {len(share.cuda_vmm.chunks)} chunks, offset {share.offset}")
        src_blocks = [(7 * i + 3) % 4096 for i in range(2048)]
        dst_blocks = [4095 - 2 * i for i in range(2048)]
        t0 = time.perf_counter()
        status = client.transfer(src_region, src_blocks, dst_region, dst_blocks).result(timeout=60)
        dt = time.perf_counter() - t0
        torch.cuda.synchronize()
        check(torch.equal(dst[:, dst_blocks], src[:, src_blocks]),
              f"512 MiB of scattered blocks cuMem -> cuMem ({status.engine}, "
              f"{status.bytes_total / dt / 1e9:.1f} GB/s first transfer)")
        untouched = torch.ones(4096, dtype=torch.bool)
        untouched[dst_blocks] = False
        check(int(dst[:, untouched].abs().sum()) == 0, "blocks outside the table untouched")

        # Per-layer cuMem tensors as one region.
        layers = [torch.randn((2, 64, 16, 2, 128), dtype=torch.bfloat16, device="cuda:0")
                  for _ in range(4)]
        out = [torch.zeros_like(x) for x in layers]
        a = register_kv_cache(client, layers, "vllm_nhd", writable=False, name="vmm layers")
        b = register_kv_cache(client, out, "vllm_nhd", writable=True, name="vmm layers out")
        check(all(s.WhichOneof("via") == "cuda_vmm" for s in a.info.spec.layer_shares),
              "per-layer shares are cuMem")
        client.transfer(a, [5, 9, 1], b, [0, 63, 7]).result(timeout=60)
        torch.cuda.synchronize()
        check(all(torch.equal(o[:, [0, 63, 7]], x[:, [5, 9, 1]]) for x, o in zip(layers, out)),
              "per-layer cuMem -> per-layer cuMem")
        # Unregistering while the tensor lives: the daemon's mapping goes, the memory stays ours.
        src_region.unregister()
        check(float(src.float().abs().sum()) > 0, "the client's memory is intact after unregister")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
