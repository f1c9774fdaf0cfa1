#!/usr/bin/env python3
"""Submission queue and completion queue vs the packet path (modes sq, queue, packets; host
engine, build machine, no GPU), against a running
kvraild: a 4 KiB transfer's submit -> completion seen by Python (p50/p99 of 1,800 sequential ones, spec
built in Python included; "wait": result(), the daemon's whole status, one call after the end;
"seen": wait_end(), the end as the completion queue holds it), 1,000 transfers in flight from one Python thread awaited on the event
loop (the whole await, and each one's lag from the daemon's finish time to the awaiting
coroutine resuming), and the batch status
of 10,000 ended transfers (one kvrail_poll). Each row is taken `runs` times; median/min/max of the
per-run figures are printed.

  PYTHONPATH=<kvrail package with generated protos> KVRAIL_LIB=.../libkvrail.so \\
      python3 tests/bench/completion_queue_bench.py SOCKET [runs]
"""
import asyncio
import os
import statistics
import sys
import time

import kvrail
from kvrail.layouts import PagedLayout

SOCK = sys.argv[1]
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
# 4 KiB blocks: 1 layer, 1 part, 256 blocks of 1 token x 1 head x 2048 bf16.
LAYOUT = PagedLayout(num_layers=1, num_parts=1, num_blocks=256, tokens_per_block=1, num_heads=1,
                     head_dim=2048)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def one_config(mode: str):
    os.environ["KVRAIL_COMPLETION_QUEUE"] = "1" if mode != "packets" else "0"
    os.environ["KVRAIL_SUBMISSION_QUEUE"] = "1" if mode == "sq" else "0"
    with kvrail.connect(SOCK) as c:
        a, b = kvrail.HostBuffer(LAYOUT.nbytes), kvrail.HostBuffer(LAYOUT.nbytes)
        ra = c.register_host_buffer(a, layout=LAYOUT)
        rb = c.register_host_buffer(b, layout=LAYOUT, writable=True)
        lat = []
        for i in range(2000):
            t0 = time.perf_counter()
            c.transfer(ra, [i % 256], rb, [(i * 7) % 256]).result()
            lat.append((time.perf_counter() - t0) * 1e6)
        lat = lat[200:]
        # The same, the end seen from the completion queue (wait_end: no call after it).
        ended = []
        for i in range(2000):
            t0 = time.perf_counter()
            c.transfer(ra, [i % 256], rb, [(i * 5) % 256]).wait_end()
            ended.append((time.perf_counter() - t0) * 1e6)
        ended = ended[200:]

        async def seen(t):
            # When this coroutine resumes after the end, against the daemon's finish time (the
            # same host clock): how long after kvraild finished it Python saw it.
            status = await t
            return time.time() * 1e6 - status.finished_unix_us

        async def inflight():
            # 1,000 submitted back to back, each awaited from its submit on; the loop runs
            # between submits (the thread is shared: a lag includes the submit it was in).
            t0 = time.perf_counter()
            ts, tasks = [], []
            for i in range(1000):
                ts.append(c.transfer(ra, [i % 256], rb, [(i * 3) % 256]))
                tasks.append(asyncio.ensure_future(seen(ts[-1])))
                await asyncio.sleep(0)
            lags = await asyncio.gather(*tasks)
            return (time.perf_counter() - t0) * 1e3, ts, lags
        ms, ts, lags = asyncio.run(inflight())
        ids = [t.id for t in ts] * 10
        t0 = time.perf_counter()
        states = c.poll(ids)
        batch_ms = (time.perf_counter() - t0) * 1e3
        assert all(kvrail.is_final(s) for s in states)
        return (pct(lat, 50), pct(lat, 99), pct(ended, 50), pct(ended, 99), ms, pct(lags, 50),
                pct(lags, 99), batch_ms)


def main():
    rows = {}
    for mode in ("sq", "queue", "packets"):
        for _ in range(RUNS):
            for k, v in zip(("wait_p50_us", "wait_p99_us", "seen_p50_us", "seen_p99_us",
                             "await_1000_ms", "seen_lag_p50_us", "seen_lag_p99_us",
                             "poll_10000_ms"),
                            one_config(mode)):
                rows.setdefault((mode, k), []).append(v)
    print(f"{'path':8} {'figure':16} {'median':>10} {'min':>10} {'max':>10}   ({RUNS} runs)")
    for (mode, k), xs in rows.items():
        print(f"{mode:8} {k:16} {statistics.median(xs):10.1f} "
              f"{min(xs):10.1f} {max(xs):10.1f}")


if __name__ == "__main__":
    main()
