#!/usr/bin/env python3
"""GEMM load for cuda_engine_bench's interference table: an 8192^3 bf16 matmul loop on one GPU, in
its own process (beside kvraild under MPS, as an inference server would be). Prints "ready" once
warmed up, then runs for --seconds and prints "tflops <achieved>" (2*8192^3 per product)."""
import argparse
import sys
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--n", type=int, default=8192)
    args = p.parse_args()
    torch.cuda.set_device(args.device)
    n = args.n
    a = torch.randn((n, n), dtype=torch.bfloat16, device="cuda")
    b = torch.randn((n, n), dtype=torch.bfloat16, device="cuda")
    c = torch.empty((n, n), dtype=torch.bfloat16, device="cuda")
    for _ in range(5):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    print("ready", flush=True)
    sys.stdin.readline()  # the bench says "go" when its transfers start
    count = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(4):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        count += 4
        sec = time.perf_counter() - t0
        if sec >= args.seconds:
            break
    print(f"tflops {2 * n ** 3 * count / sec / 1e12:.1f}", flush=True)


if __name__ == "__main__":
    main()
