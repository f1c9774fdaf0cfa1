#!/usr/bin/env python3
"""NCCL baseline for cuda_engine_bench: move randomly scattered blocks GPU0 -> GPU1 the way a
PyTorch server would without kvrail: index_select pack on GPU0, NCCL send/recv, index_copy_
unpack on GPU1 (one process per GPU). Prints one line per block size:
    nccl <block KiB> <GB/s> <seconds>
timed from both ranks' barrier to the unpack finished on GPU1 (best of --reps after a warm-up).
NVLink multicast stays off (NCCL_NVLS_ENABLE=0)."""
import argparse
import os
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    for kib in args.block_kib:
        block = kib * 1024
        moved = args.total_bytes // block
        pool = 2 * moved
        gen = torch.Generator().manual_seed(1 + rank)
        ids = torch.randperm(pool, generator=gen)[:moved].cuda()
        # Pools as [blocks, block bytes] of uint8: pack/unpack move whole blocks.
        pool_t = torch.empty((pool, block), dtype=torch.uint8, device="cuda")
        pool_t.fill_(rank + 1)
        buf = torch.empty((moved, block), dtype=torch.uint8, device="cuda")
        best = 1e9
        for rep in range(args.reps + 1):
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                torch.index_select(pool_t, 0, ids, out=buf)
                dist.send(buf, 1)
            else:
                dist.recv(buf, 0)
                pool_t.index_copy_(0, ids, buf)
            torch.cuda.synchronize()
            sec = time.perf_counter() - t0
            if rep > 0:
                best = min(best, sec)
        if rank == 1:
            # The unpacked blocks hold GPU0's bytes.
            assert bool((pool_t[ids] == 1).all()), "NCCL baseline moved the wrong bytes"
            print(f"nccl {kib} {moved * block / best / 1e9:.1f} {best:.6f}", flush=True)
        del pool_t, buf
        torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--total-bytes", type=int, default=1 << 30)
    p.add_argument("--block-kib", type=int, nargs="+", default=[4, 16, 32, 128])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    port = args.port
    if port == 0:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
