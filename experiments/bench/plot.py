"""The plot of ``make bench`` (matplotlib, Agg): added p99, CPU per request, RSS at 12x."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments._harness.stats import median
from experiments.bench.report import configs, pick, rates


def plot(doc: dict[str, Any], path: Path) -> None:
    """Three panels: p99 vs rate, CPU us/request, gateway RSS over time at 12x."""
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.8))
    rs = rates(doc)
    names = configs(doc)
    for c in names:
        ax1.plot(rs, [pick(doc, c, r, "p99_ms") for r in rs], marker="o", label=c)
    ax1.set(xlabel="offered rps (open loop)", ylabel="p99 ms (median of reps)", yscale="log",
            title="p99 latency vs offered rate")  # fmt: skip
    ax1.axhline(50, color="grey", ls=":", lw=1)
    ax1.legend(fontsize=7)
    proxies = [c for c in names if c != "direct"]
    cpu = [median([pick(doc, c, r, "cpu_us") for r in rs[:2]]) for c in proxies]
    ax2.bar(range(len(proxies)), cpu, color="tab:blue")
    ax2.set_xticks(range(len(proxies)), proxies, rotation=30, ha="right", fontsize=8)
    low = ", ".join(f"{r:,.0f}" for r in rs[:2])
    ax2.set(ylabel="CPU us per request", yscale="log", title=f"proxy CPU per request ({low} rps)")
    for i, v in enumerate(cpu):
        ax2.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    for c in doc["capacity"]:
        if c["multiple"] == 12.0:
            ax3.plot(c["rss_timeline_mb"], label=f"{c['config']} (peak held {c['peak_held']})")
    ax3.set(xlabel="seconds at 12x the knee", ylabel="gateway RSS MB",
            title="gateway RSS at 12x overload")  # fmt: skip
    ax3.axhline(256, color="grey", ls=":", lw=1)
    if doc["capacity"]:
        ax3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
