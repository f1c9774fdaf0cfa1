"""GB/s against piece size per system, one panel per scenario (matplotlib, PNG)."""
from __future__ import annotations

from typing import Any, Dict, List

import kvshape

SIZES = {"4k": 4, "32k": 32, "256k": 256}


def _color(label: str) -> str:
    """One colour per system and transport in every panel."""
    for key, color in (("kvrail", "tab:blue"), ("Mooncake", "tab:red"), ("UCX sm", "tab:orange"),
                       ("UCX tcp", "tab:green")):
        if key in label:
            return color
    return "tab:gray"


def plot(rows: List[Dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    # The plot compares equal request sizes: the largest request of each piece kind.
    biggest = {}
    for r in rows:
        if not r["latency_row"]:
            biggest[r["kind"]] = max(biggest.get(r["kind"], 0), r["bytes"])
    tput = [r for r in rows if not r["latency_row"] and r["verified"]
            and r["bytes"] == biggest[r["kind"]]]
    scenarios = sorted({r["scenario"] for r in tput})
    if not scenarios:
        raise ValueError("rows: no verified throughput row to plot")
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6.2 * len(scenarios), 4.4),
                             squeeze=False)
    titles = {"A": "A: two processes, one host (host memory)",
              "B": "B: two network namespaces over veth (tcp)"}
    for ax, scenario in zip(axes[0], scenarios):
        labels = []
        for r in tput:
            if r["scenario"] == scenario and r["label"] not in labels:
                labels.append(r["label"])
        for label in labels:
            mine = sorted((r for r in tput if r["scenario"] == scenario and r["label"] == label),
                          key=lambda r: SIZES[r["kind"]])
            x = [SIZES[r["kind"]] for r in mine]
            y = [r["gbps_median"] for r in mine]
            err = [[r["gbps_median"] - r["gbps_min"] for r in mine],
                   [r["gbps_max"] - r["gbps_median"] for r in mine]]
            style = "-o" if label.startswith("kvrail") else "--s"
            ax.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=label, color=_color(label),
                        linewidth=2.2 if label.startswith("kvrail") else 1.4)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(SIZES.values()))
        ax.set_xticklabels([f"{k} KiB" for k in SIZES.values()])
        ax.set_xlabel("contiguous piece (one descriptor per piece for the peers)")
        ax.set_ylabel("GB/s (median, bars: min-max)")
        ax.set_ylim(bottom=0)
        ax.set_title(titles.get(scenario, scenario), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    request = sorted({r["bytes"] for r in tput})
    fig.suptitle(f"Paged KV move, {kvshape.LAYERS} layers x K/V x 8 heads x 128 bf16; "
                 f"request {', '.join(f'{b >> 20} MiB' for b in request)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
