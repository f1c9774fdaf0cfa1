#!/usr/bin/env python3
"""Submission queue and completion queue vs the packet path (modes sq, queue, packets; host
engine, build machine, no GPU), against a running kvraild: a 4 KiB transfer's submit ->
completion seen by Python (p50/p99 of 1,800 sequential ones, spec built in Python included;
"wait": result(), the daemon's whole status, one call after the end; "seen": wait_end(), the end
as the completion queue holds it), 1,000 transfers in flight from one Python thread awaited on
the event loop (the whole await, and each one's lag from the daemon's finish time to the
awaiting coroutine resuming), and the batch status of 10,000 ended transfers (one kvrail_poll).
Each row is taken `runs` times; median/min/max of the per-run figures are printed.

With --cxx=PATH (the completion_bench binary, bazel-bin/tests/bench/completion_bench), the C++
figures of the same rows are taken in the same run: before each Python round, one run of the C++
bench (it starts its own kvraild from the runfiles tree $TEST_SRCDIR, else PATH.runfiles: set it
to one holding the same kvraild as SOCKET's, e.g. //python:python_test's; the path it used is
printed), and the table ends with Python / C++ (medians) for sq seen and wait. The load average
is printed at the start and the end.

  PYTHONPATH=<kvrail package with generated protos> KVRAIL_LIB=.../libkvrail.so \\
      python3 tests/bench/completion_queue_bench.py SOCKET [runs] [--cxx=PATH]
"""
import asyncio
import os
import statistics
import subprocess
import sys
import time

import kvrail
from kvrail.layouts import PagedLayout

ARGS = [a for a in sys.argv[1:] if not a.startswith("--cxx=")]
CXX = next((a[len("--cxx="):] for a in sys.argv[1:] if a.startswith("--cxx=")), "")
SOCK = ARGS[0]
RUNS = int(ARGS[1]) if len(ARGS) > 1 else 3
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


def cxx_once(rows):
    """One run of the C++ completion_bench (its first table: mode, figure, value)."""
    path = os.path.abspath(CXX)
    srcdir = os.environ.get("TEST_SRCDIR") or path + ".runfiles"
    runfiles = os.path.join(srcdir, "kvrail")
    env = dict(os.environ, TEST_SRCDIR=srcdir, TEST_WORKSPACE="kvrail")
    out = subprocess.run([path, "1", "--first-table-only"],
                         cwd=runfiles if os.path.isdir(runfiles) else None, env=env,
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if not line.strip():
            break  # the first table ends at the blank line before the spin table
        parts = line.split()
        if len(parts) == 5 and parts[0] in ("sq", "queue", "packets"):
            try:
                rows.setdefault(("C++ " + parts[0], parts[1]), []).append(float(parts[2]))
            except ValueError:
                pass


def main():
    rows = {}
    load_start = os.getloadavg()
    for _ in range(RUNS):
        if CXX:
            cxx_once(rows)
        for mode in ("sq", "queue", "packets"):
            for k, v in zip(("wait_p50_us", "wait_p99_us", "seen_p50_us", "seen_p99_us",
                             "await_1000_ms", "seen_lag_p50_us", "seen_lag_p99_us",
                             "poll_10000_ms"),
                            one_config(mode)):
                rows.setdefault((mode, k), []).append(v)
    load_end = os.getloadavg()
    if CXX:
        srcdir = os.environ.get("TEST_SRCDIR") or os.path.abspath(CXX) + ".runfiles"
        daemon = os.path.realpath(os.path.join(srcdir, "kvrail/daemon/kvraild"))
        print("C++ bench's kvraild:", daemon)
    print(f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
          f"at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    print(f"{'path':12} {'figure':18} {'median':>10} {'min':>10} {'max':>10}   ({RUNS} runs)")
    for (mode, k), xs in sorted(rows.items(), key=lambda kv: kv[0][0].startswith("C++")):
        print(f"{mode:12} {k:18} {statistics.median(xs):10.1f} "
              f"{min(xs):10.1f} {max(xs):10.1f}")
    for k in ("seen_p50_us", "wait_p50_us"):
        py, cxx = rows.get(("sq", k)), rows.get(("C++ sq", k))
        if py and cxx:
            print(f"{'ratio sq':12} {k:18} {statistics.median(py) / statistics.median(cxx):10.2f}"
                  "   (Python median / C++ median, same run)")


if __name__ == "__main__":
    main()
