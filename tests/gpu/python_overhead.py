#!/usr/bin/env python3
"""The Python overhead benchmark, on the GPU machine: a 16 MiB transfer from --src-gpu to
--dst-gpu (GPU0 -> GPU0 by default), submit -> completion seen by the caller, p50/p99 with min
and max, through the Python package (torch tensors
registered with kvrail.tensors, Client.transfer + Transfer.wait) beside the C++ client
(submit_latency_bench, the same layout, blocks and daemon) in the same run. Target: Python p50
within 1.3x of C++. Prints a table.

  python_overhead.py --socket SOCK --cxx-bench PATH [--iterations N] [--src-gpu N] [--dst-gpu N]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

import kvrail
from kvrail.tensors import register_tensor


def python_latencies(socket: str, iterations: int, src_gpu: int, dst_gpu: int) -> list:
    # [part=2][block=512][token=16][head=8][dim=128] bf16, one layer: 256 blocks = 16 MiB.
    shape = (2, 512, 16, 8, 128)
    src = torch.randn(shape, dtype=torch.bfloat16, device=f"cuda:{src_gpu}")
    dst = torch.zeros(shape, dtype=torch.bfloat16, device=f"cuda:{dst_gpu}")
    src_blocks = [(i * 7) % 512 for i in range(256)]
    dst_blocks = [511 - i for i in range(256)]
    with kvrail.connect(socket) as client:
        src_region = register_tensor(client, src, layout="PBTHD", writable=False, name="py-src")
        dst_region = register_tensor(client, dst, layout="PBTHD", writable=True, name="py-dst")
        out = []
        for i in range(iterations + 20):
            t0 = time.perf_counter()
            status = client.transfer(src_region, src_blocks, dst_region, dst_blocks).wait()
            t1 = time.perf_counter()
            assert status.state == kvrail.transfer_pb2.TRANSFER_STATE_SUCCEEDED, status
            if i >= 20:
                out.append((t1 - t0) * 1e6)
        torch.cuda.synchronize(dst_gpu)
        assert torch.equal(dst[:, dst_blocks].cpu(), src[:, src_blocks].cpu()), "bytes differ"
    return sorted(out)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--cxx-bench", required=True)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--src-gpu", type=int, default=0)
    parser.add_argument("--dst-gpu", type=int, default=0)
    args = parser.parse_args()
    for flag, gpu in (("--src-gpu", args.src_gpu), ("--dst-gpu", args.dst_gpu)):
        if not 0 <= gpu < torch.cuda.device_count():
            parser.error(f"{flag}: GPU {gpu} is not one of the {torch.cuda.device_count()} visible")
    pair = ["--src-gpu", str(args.src_gpu), "--dst-gpu", str(args.dst_gpu)]
    rows = []
    for round_ in range(2):  # interleaved, so drift hits both
        line = subprocess.run([args.cxx_bench, args.socket, str(args.iterations)] + pair,
                              check=True, capture_output=True, text=True).stdout.strip()
        fields = dict(f.split("=") for f in line.split()[1:])
        rows.append(("C++ client", round_, float(fields["p50_us"]), float(fields["p99_us"]),
                     float(fields["min_us"]), float(fields["max_us"])))
        lat = python_latencies(args.socket, args.iterations, args.src_gpu, args.dst_gpu)
        rows.append(("Python kvrail", round_, lat[len(lat) // 2], lat[len(lat) * 99 // 100],
                     lat[0], lat[-1]))
    print(f"16 MiB GPU{args.src_gpu} -> GPU{args.dst_gpu}, submit -> completion seen by the "
          f"caller, {args.iterations} transfers per row (20 warm-up)")
    print("| client | round | p50 us (median) | p99 us | min us | max us |")
    print("|---|---|---|---|---|---|")
    for name, r, p50, p99, lo, hi in rows:
        print(f"| {name} | {r} | {p50:.1f} | {p99:.1f} | {lo:.1f} | {hi:.1f} |")
    cxx = statistics.median(r[2] for r in rows if r[0] == "C++ client")
    py = statistics.median(r[2] for r in rows if r[0] == "Python kvrail")
    ratio = py / cxx
    print(f"Python p50 / C++ p50 = {ratio:.2f} (target <= 1.30: {'met' if ratio <= 1.3 else 'missed'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
