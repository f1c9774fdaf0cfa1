"""NIXL's agent with kvrail's KVRAIL backend vs NIXL's own UCX backend: the same two processes
(an initiator and a target agent, host memory), the same scattered descriptor lists, WRITE.
Prints a table (median, min, max of the timed runs; each row's moved bytes checked by digest)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from peers import PeerProcess, pair, scattered


def run_backend(backend: str, env: dict[str, str], size: int, cases: list[tuple[int, int]],
                runs: int, fresh: bool) -> dict[tuple[int, int], list[float]]:
    a, b = pair(backend, size, env)
    results: dict[tuple[int, int], list[float]] = {}
    try:
        a.call("fill", seed=1)
        for piece, count in cases:
            pieces = scattered(size, piece, count, seed=piece * 7 + count)
            b.call("fill", seed=2)
            answer = a.call("xfer", kind="WRITE", remote="B", remote_base=b.base, pieces=pieces,
                            runs=runs + 1, fresh=fresh)
            src = a.call("digest_ranges", ranges=[[lo, n] for lo, _, n in pieces])["sha256"]
            dst = b.call("digest_ranges", ranges=[[ro, n] for _, ro, n in pieces])["sha256"]
            if src != dst:
                raise RuntimeError(f"{backend} {piece}x{count}: moved bytes differ")
            results[(piece, count)] = answer["seconds"][1:]  # the first run warms up
    finally:
        a.close()
        b.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pieces", default="4096,32768")
    parser.add_argument("--counts", default="256,1024,8192")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fresh", action="store_true",
                        help="a new NIXL request per run (timed from initialize_xfer)")
    parser.add_argument("--socket", default=os.environ.get("KVRAIL_SOCKET", ""))
    parser.add_argument("--plugin-dir", default=os.environ.get("NIXL_PLUGIN_DIR", ""))
    args = parser.parse_args()
    cases = [(int(p), int(c)) for p in args.pieces.split(",") for c in args.counts.split(",")]
    size = 2 * max(p * c for p, c in cases)
    kv_env = dict(os.environ, KVRAIL_SOCKET=args.socket, NIXL_PLUGIN_DIR=args.plugin_dir)
    ucx_env = {k: v for k, v in os.environ.items() if k != "NIXL_PLUGIN_DIR"}
    started = time.time()
    kv = run_backend("KVRAIL", kv_env, size, cases, args.runs, args.fresh)
    ucx = run_backend("UCX", ucx_env, size, cases, args.runs, args.fresh)
    mode = "new request per run" if args.fresh else "one request, reposted"
    print(f"NIXL agent WRITE, two processes, host memory; {mode}; {args.runs} runs per row "
          f"(after one warm-up); ms median [min-max]")
    print("| piece | blocks | MiB | KVRAIL ms | UCX ms | KVRAIL GB/s | UCX GB/s | UCX/KVRAIL |")
    print("|---|---|---|---|---|---|---|---|")
    for piece, count in cases:
        k, u = kv[(piece, count)], ucx[(piece, count)]
        mk, mu = statistics.median(k), statistics.median(u)
        moved = piece * count
        print(f"| {piece // 1024} KiB | {count} | {moved / 2**20:.0f} | "
              f"{mk * 1e3:.2f} [{min(k) * 1e3:.2f}-{max(k) * 1e3:.2f}] | "
              f"{mu * 1e3:.2f} [{min(u) * 1e3:.2f}-{max(u) * 1e3:.2f}] | "
              f"{moved / mk / 1e9:.2f} | {moved / mu / 1e9:.2f} | {mu / mk:.2f}x |")
    print(f"({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
