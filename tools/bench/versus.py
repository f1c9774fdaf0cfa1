#!/usr/bin/env python3
"""kvrail beside Mooncake Transfer Engine and NIXL on the same paged KV moves, in one run.

Each system moves the same request: n scattered blocks of a Llama-3-8B-like pool (32 layers, K and
V, 8 KV heads, head_dim 128, bf16), every layer and both K and V of each block, from a source pool
in one process into a destination pool in another. Contiguous pieces ("kinds"):
  4k    HND pool, 16-token blocks, ONE head of 8 moves (TP-1 prefill -> TP-8 decode rank)
  32k   NHD pool, 16-token blocks, all heads
  256k  NHD pool, 128-token blocks, all heads
Mooncake and NIXL get one descriptor per contiguous run (adjacent pieces merged, as their vLLM
connectors build them); kvrail gets its two block tables (one Client.transfer).

Scenarios:
  A  two processes on one host, host memory:
       kvrail   host engine: one kvraild, both processes its clients (a write grant)
       mooncake tcp on 127.0.0.1 (the non-CUDA wheel has no shared-memory transport: its
                transports are TcpTransport and RdmaTransport only)
       nixl     UCX backend, UCX_TLS=sm,self (posix/sysv shared memory + cma) and UCX_TLS=tcp,self
  B  two network namespaces joined by a veth pair this script makes (root), a daemon/agent in each:
       kvrail   fabric: kvraild per namespace, libfabric tcp;ofi_rxm, 1 MiB tiles, 16 slots,
                the destination region exported to the source node
       mooncake tcp over the veth addresses
       nixl     UCX_TLS=tcp,self, UCX_NET_DEVICES=the veth
  C  GPU VRAM: not run by this script; tools/bench/versus_gpu.py on the GPU machine.

Every request is the source side pushing (WRITE): kvrail's Client.transfer + result(), Mooncake's
batch_transfer_sync_write (the descriptor lists built per request from the block tables, as its
connector does), NIXL's make_prepped_xfer(WRITE) over descriptor lists prepared once for every
piece of both pools (vLLM's NIXL connector) + transfer + check_xfer_state polling until DONE.
Peers run with their connectors' settings: NIXL num_threads=4 (vLLM's default; --nixl-threads),
progress thread on, ucx_error_handling_mode "none" for the sm row (UCX's shared-memory transports
have no peer failure handler; NIXL's default "peer" mode refuses them); Mooncake defaults
(P2PHANDSHAKE, no metadata server) except MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER=16384 (its default
1024 rejects a 16,384-descriptor batch). kvraild runs with its defaults (scenario B: 1 MiB tiles,
16 slots, one endpoint per daemon: --fabric-tile, --fabric-slots, --fabric-nics).

Quantities per row: GB/s = request bytes / (request issued -> source side sees it complete),
median of --reps timed requests after one warm-up, with min and max; CPU seconds per GB moved on
each side (/proc/<pid>/stat of the worker processes, and of kvraild, whose CPU is kvrail's cost
too); set-up = memory registration on both sides + metadata exchange / connection (kvrail:
register + grant or export); 16 MiB request latency p50/p99 (--lat-reps requests, one at a time).
Every system's destination is zeroed before each timed request and compared with the source byte
for byte after it; a row that does not verify prints FAILED and no figures.

The machine is noisy (2 cores, other builds): medians, and the load average is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "versus"))
import kvshape  # noqa: E402
import procs  # noqa: E402

MIB = 1 << 20
# (kind, blocks): throughput rows are 64 MiB requests (16,384 / 2,048 / 256 pieces) plus one small
# request (4 MiB of 32k pieces, 128 pieces: where a fixed per-request cost shows), latency rows
# 16 MiB (4,096 / 512 / 64 pieces).
FULL_TPUT = [("4k", 256), ("32k", 2), ("32k", 32), ("256k", 4)]
FULL_LAT = [("4k", 64), ("32k", 8), ("256k", 1)]
QUICK_TPUT = [("4k", 64), ("32k", 8), ("256k", 1)]
SMOKE_TPUT = [("32k", 2)]


# Mooncake's TCP transport refuses a batch once a peer's queue holds more transfers than
# MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER ("TCP lane queue-full rejection", the batch returns -1): a
# 16,384-descriptor request (4k pieces) needs the queue that deep.
MOONCAKE_ENV = {"MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER": "16384"}


def variants(scenario: str, ns: Optional[procs.NetnsPair]) -> List[Dict[str, Any]]:
    """The systems of a scenario: name, transport label, per-side options and environment."""
    if scenario == "A":
        return [
            {"system": "kvrail", "label": "kvrail host engine", "env": {}},
            {"system": "mooncake", "label": "Mooncake tcp", "env": MOONCAKE_ENV,
             "options": {"protocol": "tcp", "ip": "127.0.0.1"}},
            {"system": "nixl", "label": "NIXL UCX sm (shm+cma)",
             "env": {"UCX_TLS": "sm,self"},
             "options": {"nixl_params": {"ucx_error_handling_mode": "none"}}},
            {"system": "nixl", "label": "NIXL UCX tcp",
             "env": {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}},
        ]
    assert ns is not None
    return [
        {"system": "kvrail", "label": "kvrail fabric (libfabric tcp)", "env": {}},
        {"system": "mooncake", "label": "Mooncake tcp", "env": MOONCAKE_ENV, "per_side": [
            {"protocol": "tcp", "ip": ns.ip[0]}, {"protocol": "tcp", "ip": ns.ip[1]}]},
        {"system": "nixl", "label": "NIXL UCX tcp", "env": {"UCX_TLS": "tcp,self"},
         "per_side_env": [{"UCX_NET_DEVICES": ns.veth[0]}, {"UCX_NET_DEVICES": ns.veth[1]}]},
    ]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = procs.temp_dir()
        self.base_env = dict(os.environ)
        self.base_env["PYTHONPATH"] = os.pathsep.join(
            p for p in [args.kvrail_python, self.base_env.get("PYTHONPATH", "")] if p)
        if args.kvrail_lib:
            self.base_env["KVRAIL_LIB"] = args.kvrail_lib
        self.base_env.setdefault("NIXL_LOG_LEVEL", "WARN")
        self.base_env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.daemons: List[Any] = []  # (Popen, socket) per side; one for scenario A
        self.ns: Optional[procs.NetnsPair] = None
        self.logs = 0

    def log(self, what: str) -> str:
        self.logs += 1
        return os.path.join(self.dir, f"{self.logs:03d}-{what}.log")

    # --- kvraild ----------------------------------------------------------------------------
    def start_daemons(self, scenario: str) -> None:
        a = self.args
        if scenario == "A":
            socket = os.path.join(self.dir, "kvrail.sock")
            log = self.log("kvraild")
            d = procs.start([a.kvraild, "--socket", socket, "--node-id", "local",
                             "--log-level", "warn"], env=self.base_env, log=log)
            procs.wait_for_daemon(a.python, self.base_env, [], socket, d, log)
            self.daemons = [(d, socket)]
            return
        ns = self.ns
        assert ns is not None
        names, port = ["a", "b"], 7170
        self.daemons = []
        for i in range(2):
            socket = os.path.join(self.dir, f"kvrail-{names[i]}.sock")
            config = os.path.join(self.dir, f"kvraild-{names[i]}.textproto")
            with open(config, "w") as f:
                f.write(f'node_id: "{names[i]}"\ninsecure_peers: true\n'
                        f'peers {{ key: "{names[1 - i]}" value: "{ns.ip[1 - i]}:{port}" }}\n'
                        'fabric {\n' + f'  nics: "{ns.ip[i]}"\n' * a.fabric_nics +
                        f'  slots: {a.fabric_slots}\n'
                        f'  slot_bytes: {a.fabric_tile}\n  liveness_timeout_ms: 5000\n'
                        f'  heartbeat_interval_ms: 200\n}}\n')
            log = self.log(f"kvraild-{names[i]}")
            d = procs.start(ns.prefix(i) + [
                a.kvraild, "--socket", socket, "--tcp-listen", f"{ns.ip[i]}:{port}",
                "--node-id", names[i], "--config", config, "--tile-bytes", str(a.fabric_tile),
                "--log-level", "warn", "--drain-timeout-ms", "1000"], env=self.base_env, log=log)
            procs.wait_for_daemon(a.python, self.base_env, ns.prefix(i), socket, d, log)
            self.daemons.append((d, socket))

    def stop_daemons(self) -> None:
        for d, _ in self.daemons:
            procs.stop(d)
        self.daemons = []

    def daemon_cpu(self) -> List[float]:
        return [procs.cpu_seconds(d.pid) for d, _ in self.daemons]

    # --- one system, one request shape ----------------------------------------------------------
    def row(self, scenario: str, v: Dict[str, Any], kind: str, blocks: int, reps: int,
            latency: bool) -> Dict[str, Any]:
        g = kvshape.Geometry(kind, blocks, seed=self.args.seed)
        out: Dict[str, Any] = {"scenario": scenario, "system": v["system"], "label": v["label"],
                               "kind": kind, "blocks": blocks, "pieces": g.pieces,
                               "descriptors": int(len(g.descriptors()[2])),
                               "bytes": g.request_bytes, "latency_row": latency}
        workers: List[procs.Worker] = []
        try:
            for i, role in enumerate(["src", "dst"]):
                env = dict(self.base_env, **v.get("env", {}))
                env.update(v.get("per_side_env", [{}, {}])[i])
                prefix = self.ns.prefix(i) if scenario == "B" else []
                workers.append(procs.Worker(self.args.python, prefix, env,
                                            self.log(f"{v['system']}-{kind}-{role}")))
            src, dst = workers
            for i, (w, role) in enumerate(zip(workers, ["src", "dst"])):
                options = dict(v.get("options", {}), **v.get("per_side", [{}, {}])[i])
                options.setdefault("num_threads", self.args.nixl_threads)
                options.setdefault("poll_s", self.args.nixl_poll_us / 1e6)
                if v["system"] == "kvrail":
                    options["socket"] = self.daemons[min(i, len(self.daemons) - 1)][1]
                    if scenario == "B":
                        options["node"] = ["a", "b"][i]
                        options["peer_node"] = "a" if role == "dst" else ""
                w.send("setup", system=v["system"], role=role, kind=kind, blocks=blocks,
                       seed=self.args.seed, options=options)
            set_src, set_dst = src.receive(), dst.receive()
            connected = src.call("connect", peer=set_dst["info"])
            out["setup_ms"] = 1e3 * (set_src["register_s"] + set_dst["register_s"]
                                     + connected["connect_s"])
            # The check can fail: a zeroed destination must not verify.
            dst.call("poison")
            if not dst.call("verify", seed=self.args.seed)["mismatch"]:
                raise RuntimeError("a zeroed destination verified: the check is broken")
            # Warm-up request, checked.
            src.call("run", reps=1)
            bad = dst.call("verify", seed=self.args.seed)["mismatch"]
            if bad:
                raise RuntimeError(f"warm-up did not verify: {bad}")
            seconds: List[float] = []
            cpu = [0.0, 0.0]
            dcpu = [0.0] * len(self.daemons)
            detail: Dict[str, Any] = {}
            if latency:
                dst.call("poison")
                c0, d0 = [src.cpu(), dst.cpu()], self.daemon_cpu()
                ran = src.call("run", reps=reps)
                c1, d1 = [src.cpu(), dst.cpu()], self.daemon_cpu()
                cpu = [c1[k] - c0[k] for k in range(2)]
                dcpu = [d1[k] - d0[k] for k in range(len(dcpu))]
                seconds = ran["seconds"]
                detail = ran["detail"]
                bad = dst.call("verify", seed=self.args.seed)["mismatch"]
            else:
                for _ in range(reps):
                    dst.call("poison")
                    c0, d0 = [src.cpu(), dst.cpu()], self.daemon_cpu()
                    ran = src.call("run", reps=1)
                    c1, d1 = [src.cpu(), dst.cpu()], self.daemon_cpu()
                    seconds += ran["seconds"]
                    detail = ran["detail"]
                    cpu = [cpu[k] + c1[k] - c0[k] for k in range(2)]
                    dcpu = [dcpu[k] + d1[k] - d0[k] for k in range(len(dcpu))]
                    bad = dst.call("verify", seed=self.args.seed)["mismatch"]
                    if bad:
                        break
            if bad:
                raise RuntimeError(f"destination did not verify: {bad}")
            gb = g.request_bytes * len(seconds) / 1e9
            gbps = sorted(g.request_bytes / s / 1e9 for s in seconds)
            out.update(verified=True, reps=len(seconds), seconds=seconds,
                       gbps_median=statistics.median(gbps), gbps_min=gbps[0],
                       gbps_max=gbps[-1], detail=_short(detail))
            if latency:
                ms = sorted(1e3 * s for s in seconds)
                out.update(p50_ms=_pct(ms, 50), p99_ms=_pct(ms, 99))
            # CPU per GB over the timed requests. kvraild's CPU is kvrail's cost: the one daemon
            # of scenario A counts apart (both sides' total); in B each daemon on its own side.
            if v["system"] == "kvrail" and len(dcpu) == 2:
                cpu = [cpu[0] + dcpu[0], cpu[1] + dcpu[1]]
                out["cpu_daemon_s_per_gb"] = [d / gb for d in dcpu]
            elif v["system"] == "kvrail":
                out["cpu_daemon_s_per_gb"] = [dcpu[0] / gb]
            out["cpu_src_s_per_gb"] = cpu[0] / gb
            out["cpu_dst_s_per_gb"] = cpu[1] / gb
            out["cpu_total_s_per_gb"] = (cpu[0] + cpu[1]) / gb + (
                dcpu[0] / gb if v["system"] == "kvrail" and len(dcpu) == 1 else 0.0)
        except Exception as e:  # the row fails, the run goes on
            out.update(verified=False, error=str(e).strip()[:2000])
        finally:
            for w in workers:
                w.close()
        return out


def _short(detail: Dict[str, Any]) -> Dict[str, Any]:
    """Per-transfer phases reduced to medians (kvrail's daemon-side timings)."""
    phases = detail.get("phases")
    if not phases:
        return detail
    keys = phases[0].keys()
    return dict({k: v for k, v in detail.items() if k != "phases"},
                **{k: statistics.median(p[k] for p in phases) for k in keys})


def _pct(sorted_values: List[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(pct / 100 * (len(sorted_values) - 1)))))
    return sorted_values[k]


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // 1024} KiB"


def _cpu(r: Dict[str, Any]) -> str:
    if "cpu_src_s_per_gb" not in r:  # a JSON of a run before latency rows measured CPU
        return "-"
    daemon = r.get("cpu_daemon_s_per_gb")
    dtext = f" ({' / '.join(f'{d:.2f}' for d in daemon)})" if daemon else ""
    return f"{r['cpu_src_s_per_gb']:.2f} / {r['cpu_dst_s_per_gb']:.2f}{dtext}"


def _shapes(rows: List[Dict[str, Any]], kinds: List[str]) -> List[Tuple[str, int]]:
    """(kind, blocks) of the rows, kinds in `kinds` order, smaller requests first."""
    return sorted({(r["kind"], r["blocks"]) for r in rows},
                  key=lambda kb: (kinds.index(kb[0]), kb[1]))


def _verified_rows(rows: list, kinds: list, out):
    """Each request shape's rows, kvrail's first, as (kind, request text, row, kvrail's verified
    row or None); a row that did not verify is printed as FAILED here and not yielded."""
    for kind, blocks in _shapes(rows, kinds):
        group = [r for r in rows if r["kind"] == kind and r["blocks"] == blocks]
        kv = next((r for r in group if r["system"] == "kvrail" and r["verified"]), None)
        for r in sorted(group, key=lambda r: r["system"] != "kvrail"):
            req = f"{_size(r['bytes'])}, {r['blocks']} blocks, {r['descriptors']} desc"
            if not r["verified"]:
                print(f"| {kind} | {req} | {r['label']} | FAILED: "
                      f"{r['error'].splitlines()[0][:120]} | - | - | - | no |", file=out)
                continue
            yield kind, req, r, kv


def print_tables(scenario: str, rows: List[Dict[str, Any]], out=sys.stdout) -> None:
    kinds = [k for k in kvshape.PIECES if any(r["kind"] == k for r in rows)]
    tput = [r for r in rows if not r["latency_row"]]
    lat = [r for r in rows if r["latency_row"]]
    if tput:
        daemons = ("one kvraild serves both sides: its CPU in brackets, apart" if scenario == "A"
                   else "each side's kvraild counted in its side; in brackets, that part")
        print(f"\nScenario {scenario}: throughput (GB/s median of the timed requests, [min-max]; "
              f"ratio = kvrail / this row; CPU seconds per GB moved, {daemons})", file=out)
        print("| piece | request | system | GB/s median [min-max] | kvrail / row | CPU s/GB "
              "src / dst side (kvraild) | set-up ms | verified |", file=out)
        print("|---|---|---|---|---|---|---|---|", file=out)
        for kind, req, r, kv in _verified_rows(tput, kinds, out):
            ratio = "-" if r["system"] == "kvrail" or kv is None else \
                f"{kv['gbps_median'] / r['gbps_median']:.2f}x"
            print(f"| {kind} | {req} | {r['label']} | {r['gbps_median']:.2f} "
                  f"[{r['gbps_min']:.2f}-{r['gbps_max']:.2f}] | {ratio} | {_cpu(r)} | "
                  f"{r['setup_ms']:.0f} | yes ({r['reps']}) |", file=out)
    if lat:
        print(f"\nScenario {scenario}: 16 MiB request latency (ms; ratio = row p50 / kvrail p50)",
              file=out)
        print("| piece | request | system | p50 ms | p99 ms | row p50 / kvrail p50 | CPU s/GB src "
              "/ dst side (kvraild) | verified |", file=out)
        print("|---|---|---|---|---|---|---|---|", file=out)
        for kind, req, r, kv in _verified_rows(lat, kinds, out):
            ratio = "-" if r["system"] == "kvrail" or kv is None else \
                f"{r['p50_ms'] / kv['p50_ms']:.2f}x"
            print(f"| {kind} | {req} | {r['label']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                  f"{ratio} | {_cpu(r)} | yes ({r['reps']}) |", file=out)


def machine() -> str:
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return (f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}, "
            f"load average {load}")


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Versions: the PyPI venv of deploy/pyvenv.sh (python/requirements-ci.txt): "
               "mooncake-transfer-engine-non-cuda 0.3.13.post1, nixl-cu13 1.5.1 (its bundled "
               "UCX); kvrail from this tree. tools/bench/versus.sh builds kvrail and runs this "
               "with the venv's python.")
    p.add_argument("--scenario", default="AB",
                   help="A, B, AB, or C (GPU VRAM: runs tools/bench/versus_gpu.py, which needs "
                        "the GPU machine)")
    p.add_argument("--quick", action="store_true",
                   help="16 MiB requests, 3 timed reps, 10 latency reps (minutes less)")
    p.add_argument("--smoke", action="store_true",
                   help="CI: one 4 MiB row of 32k pieces per system, 1 timed rep, no latency "
                        "rows; every row must verify (exit 1 otherwise)")
    p.add_argument("--reps", type=int, default=5, help="timed requests per throughput row")
    p.add_argument("--lat-reps", type=int, default=50, help="requests per latency row")
    p.add_argument("--systems", default="kvrail,mooncake,nixl")
    p.add_argument("--kinds", default="4k,32k,256k")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--python", default=sys.executable, help="the workers' interpreter (the venv)")
    p.add_argument("--kvraild", default="", help="kvraild (required unless --tables-from)")
    p.add_argument("--kvrail-python", default="", help="folder holding the kvrail package")
    p.add_argument("--kvrail-lib", default="", help="libkvrail.so (KVRAIL_LIB)")
    p.add_argument("--nixl-threads", type=int, default=4,
                   help="NIXL UCX backend num_threads (vLLM's NIXL connector default: 4)")
    p.add_argument("--nixl-poll-us", type=float, default=0.0,
                   help="sleep between NIXL check_xfer_state polls (0: poll without pause)")
    p.add_argument("--fabric-tile", type=int, default=MIB, help="kvraild --tile-bytes, scenario B")
    p.add_argument("--fabric-slots", type=int, default=16)
    p.add_argument("--fabric-nics", type=int, default=1,
                   help="fabric endpoints (lanes) per daemon on the one veth address")
    p.add_argument("--json", default="", help="write every row (and the machine) here")
    p.add_argument("--tables-from", default="",
                   help="print the tables (and --plot) of an earlier run's --json file; run nothing")
    p.add_argument("--plot", default="", help="write GB/s vs piece size (PNG) here")
    args = p.parse_args(argv)
    if (set(args.scenario) - set("AB") and args.scenario != "C") or not args.scenario:
        p.error(f"--scenario: {args.scenario!r}; one of A, B, AB, C")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    if args.tables_from:
        with open(args.tables_from) as f:
            saved = json.load(f)
        print(f"versus: {saved['date_utc']}; {saved['machine']}")
        for scenario in sorted({r["scenario"] for r in saved["rows"]}):
            print_tables(scenario, [r for r in saved["rows"] if r["scenario"] == scenario])
        if args.plot:
            import plot
            plot.plot(saved["rows"], args.plot)
        return 0
    if not args.kvraild:
        raise SystemExit("--kvraild: required (the daemon the kvrail rows run against)")
    if args.scenario == "C":  # GPU memory: its own script (torch), the same request shapes
        import subprocess
        gpu = [args.python, os.path.join(HERE, "versus_gpu.py"), "--kvraild", args.kvraild]
        if args.quick:
            gpu += ["--mib", "64", "--reps", "3", "--lat-reps", "10"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in [args.kvrail_python, os.environ.get("PYTHONPATH", "")] if p))
        if args.kvrail_lib:
            env["KVRAIL_LIB"] = args.kvrail_lib
        return subprocess.call(gpu, env=env)
    procs.install_cleanup()
    systems = set(args.systems.split(","))
    kinds = set(args.kinds.split(","))
    if args.smoke:
        plan = [(k, b, 1, False) for k, b in SMOKE_TPUT]
    elif args.quick:
        plan = [(k, b, min(args.reps, 3), False) for k, b in QUICK_TPUT] + \
               [(k, b, min(args.lat_reps, 10), True) for k, b in FULL_LAT]
    else:
        plan = [(k, b, args.reps, False) for k, b in FULL_TPUT] + \
               [(k, b, args.lat_reps, True) for k, b in FULL_LAT]
    plan = [p for p in plan if p[0] in kinds]
    bench = Bench(args)
    print(f"versus: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {machine()}; "
          f"logs in {bench.dir}", flush=True)
    results: List[Dict[str, Any]] = []
    try:
        for scenario in args.scenario:
            if scenario == "B":
                why = procs.cannot_make_namespaces()
                if why:
                    raise SystemExit(f"scenario B needs network namespaces: {why}")
                bench.ns = procs.NetnsPair()
            bench.start_daemons(scenario)
            rows = []
            for kind, blocks, reps, latency in plan:
                for v in variants(scenario, bench.ns):
                    if v["system"] not in systems:
                        continue
                    t0 = time.time()
                    r = bench.row(scenario, v, kind, blocks, reps, latency)
                    r["wall_s"] = time.time() - t0
                    state = "ok" if r["verified"] else "FAILED " + r["error"].splitlines()[0]
                    figure = (f"p50 {r['p50_ms']:.2f} ms" if latency else
                              f"{r['gbps_median']:.2f} GB/s") if r["verified"] else ""
                    print(f"  {scenario} {kind:>4} {'lat' if latency else 'tput'} "
                          f"{v['label']:<32} {figure:<16} {state} ({r['wall_s']:.0f} s)",
                          flush=True)
                    rows.append(r)
            bench.stop_daemons()
            print_tables(scenario, rows)
            results += rows
    finally:
        bench.stop_daemons()
        procs._cleanup()
    print(f"\nafter: {machine()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "machine": machine(), "rows": results}, f, indent=1)
    if args.plot:
        import plot
        plot.plot(results, args.plot)
    failed = [r for r in results if not r["verified"]]
    if failed:
        print(f"\n{len(failed)} row(s) did not verify: no figure for them", file=sys.stderr)
        for r in failed:
            print(f"  {r['scenario']} {r['kind']} {r['label']}: {r['error'][:800]}",
                  file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
