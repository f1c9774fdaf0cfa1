#!/usr/bin/env python3
"""The fast path's CPU targets as one table: reads the outputs of completion_queue_bench.py (run
with --cxx, so the C++ rows are in it) and admission_bench, and prints each target with its figure
(median and min-max over the runs, as the benches printed them) and a verdict. Standard library
only; tests/bench/fast_path_targets.sh runs the benches and then this.

  fast_path_targets.py COMPLETION_QUEUE_BENCH_OUTPUT ADMISSION_BENCH_OUTPUT
"""
import sys
from typing import Dict, List, Optional, Tuple

Figure = Tuple[float, float, float]  # median, min, max


def read_queue_bench(text: str) -> Dict[Tuple[str, str], Figure]:
    """completion_queue_bench.py's rows: (path, figure) -> (median, min, max). A path is one word
    (sq, queue, packets) or two (C++ sq)."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == "C++":
            parts = [parts[0] + " " + parts[1]] + parts[2:]
        if len(parts) != 5:
            continue
        try:
            rows[(parts[0], parts[1])] = (float(parts[2]), float(parts[3]), float(parts[4]))
        except ValueError:
            continue
    return rows


def read_admission_bench(text: str) -> Dict[Tuple[str, str, str], Figure]:
    """admission_bench's table rows: (admission, small tenant, figure) -> (median, min, max); a
    cell '-' is read as the median."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] in ("admission", "---"):
            continue
        try:
            median = float(cells[3])
        except ValueError:
            continue
        low = float(cells[4]) if cells[4] != "-" else median
        high = float(cells[5]) if cells[5] != "-" else median
        rows[(cells[0], cells[1], cells[2])] = (median, low, high)
    return rows


def cell(f: Optional[Figure], unit: str) -> str:
    if f is None:
        return "not measured"
    return f"{f[0]:.1f} {unit} ({f[1]:.1f}-{f[2]:.1f})"


def verdict(f: Optional[Figure], limit: float) -> str:
    if f is None:
        return "MISSING"
    return "met" if f[0] <= limit else "missed"


def targets(queue: Dict[Tuple[str, str], Figure],
            admission: Dict[Tuple[str, str, str], Figure]) -> List[Tuple[str, str, str]]:
    """(target, figure, verdict) for each CPU target, verdicts on the medians."""
    out = []
    p50 = queue.get(("C++ sq", "seen_p50_us"))
    p99 = queue.get(("C++ sq", "seen_p99_us"))
    out.append(("4 KiB submit -> completion seen, C++, p50 <= 15 us", cell(p50, "us"),
                verdict(p50, 15)))
    out.append(("4 KiB submit -> completion seen, C++, p99 <= 60 us", cell(p99, "us"),
                verdict(p99, 60)))
    py = queue.get(("sq", "seen_p50_us"))
    if py is not None and p50 is not None:
        ratio = py[0] / p50[0]
        out.append(("Python 4 KiB within 1.3x of C++ (p50, medians of the same run)",
                    f"{ratio:.2f}x (Python {cell(py, 'us')} vs C++ {p50[0]:.1f} us)",
                    "met" if ratio <= 1.3 else "missed"))
    else:
        out.append(("Python 4 KiB within 1.3x of C++", "not measured", "MISSING"))
    lag = queue.get(("sq", "seen_lag_p99_us"))
    out.append(("1,000 in flight from one Python thread: seen <= 100 us after kvraild finished "
                "(p99)", cell(lag, "us"), verdict(lag, 100)))
    for who, path in (("Python", "sq"), ("C++", "C++ sq")):
        batch = queue.get((path, "poll_10000_ms"))
        out.append((f"batch status of 10,000 transfers <= 1 ms ({who})", cell(batch, "ms"),
                    verdict(batch, 1.0)))
    for setting, label, target in (
            ("shipped default: 4 workers + 1 bulk (SCHED_IDLE, guarded)", "the target", True),
            ("4 workers, no bulk class", "for comparison, not a target", False),
            ("floor: the large tenant only copies its ids, no kvraild work",
             "the machine's floor, not a target", False)):
        ratio = admission.get((setting, "beside large / unloaded", "p99 ratio (target <= 2)"))
        loaded = admission.get((setting, "beside large", "p99_us"))
        alone = admission.get((setting, "unloaded", "p99_us"))
        figure = ("not measured" if ratio is None or loaded is None or alone is None else
                  f"{ratio[0]:.2f}x ({loaded[0]:.1f} us beside it vs {alone[0]:.1f} unloaded)")
        out.append((f"a tenant's 2^20-block SUBMIT: another's 4 KiB p99 within 2x of unloaded "
                    f"({label}: {setting})", figure,
                    verdict(ratio, 2.0) if target else "-"))
    return out


def main(argv: List[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        queue = read_queue_bench(f.read())
    with open(argv[2]) as f:
        admission = read_admission_bench(f.read())
    rows = targets(queue, admission)
    print("| target | figure: median (min-max) | verdict |")
    print("|---|---|---|")
    for target, figure, v in rows:
        print(f"| {target} | {figure} | {v} |")
    return 1 if any(v == "MISSING" for _, _, v in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
