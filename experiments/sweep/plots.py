"""The experiment's plots (matplotlib, Agg): sweep, degrade, swing.

- ``exp_sweep.png``: critical p99 (undilated ms) and critical served share
  against offered load, one line per limiter;
- ``exp_degrade.png`` / ``exp_swing.png``: the limit and in-flight over time,
  one panel per limiter, the backend change shaded;
- ``exp_swing_served.png``: requests served per second over time in the swing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.sweep.metrics import metrics

COLORS = {"fixed-16": "tab:blue", "fixed-64": "tab:orange", "fixed-256": "tab:red",
          "gradient2": "tab:purple", "vegas": "tab:brown",
          "gradient": "tab:green", "gradient + early drop": "tab:olive",
          "haproxy-16": "tab:cyan", "haproxy-64": "tab:pink", "haproxy-256": "tab:gray",
          "nginx-32": "black"}  # fmt: skip


def _runs(docs: list[dict[str, Any]], scenario: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["spec"]["scenario"] == scenario]


def plot_sweep(docs: list[dict[str, Any]], path: Path) -> None:
    """Critical p99 and critical served share against load multiple."""
    if not _runs(docs, "sweep"):
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    by_label: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for d in _runs(docs, "sweep"):
        by_label.setdefault(d["spec"]["label"], []).append((d["spec"]["load_x"], metrics(d)))
    for label, points in by_label.items():
        points.sort(key=lambda p: p[0])
        xs = [x for x, _ in points]
        peer = label.startswith(("haproxy-", "nginx-"))
        style = {"marker": "s" if peer else "o", "color": COLORS.get(label), "label": label,
                 "ls": "--" if peer else "-"}  # fmt: skip
        ax1.plot(xs, [m["critical_p99_ms"] or 0 for _, m in points], **style)
        shares = [100 * m["critical_served"] / max(1, m["critical_sent"]) for _, m in points]
        ax2.plot(xs, shares, **style)
    ax1.axhline(400, color="grey", ls=":", lw=1)
    ax1.set(xlabel="offered load (x capacity, 1x = 250 rps)", ylabel="critical p99, ms",
            title="critical p99 from intended send time")  # fmt: skip
    ax2.set(xlabel="offered load (x capacity)", ylabel="critical served, %", ylim=(0, 105),
            title="critical requests served within deadline")  # fmt: skip
    for ax in (ax1, ax2):
        ax.set_xticks(sorted({x for pts in by_label.values() for x, _ in pts}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_limits(docs: list[dict[str, Any]], scenario: str, path: Path, title: str) -> None:
    """Limit and in-flight over time, one panel per limiter, changes shaded (not the peers:
    their limit is a constant and they have no ``/snapshot`` to sample)."""
    runs = [d for d in _runs(docs, scenario) if d["samples"]]
    if not runs:
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.8), squeeze=False)
    for ax, d in zip(axes[0], runs, strict=True):
        s = d["samples"]
        ts = [r[0] for r in s]
        ax.plot(ts, [r[1] for r in s], color=COLORS.get(d["spec"]["label"]), label="limit")
        ax.plot(ts, [r[2] for r in s], color="black", lw=0.7, alpha=0.6, label="in flight")
        events = [e[0] for e in d["spec"]["events"]]
        if len(events) >= 2:
            ax.axvspan(events[0], events[1], color="grey", alpha=0.15)
        ax.set(title=d["spec"]["label"], xlabel="seconds", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("concurrency (log)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_swing_served(docs: list[dict[str, Any]], path: Path) -> None:
    """Requests served per second (all tiers) during the swing."""
    runs = _runs(docs, "swing")
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for d in runs:
        per_s = [sum(t["served"] for t in sec.values()) for sec in d["summary"]["timeline"]]
        peer = d["spec"]["label"].startswith(("haproxy-", "nginx-"))
        ax.plot(range(len(per_s)), per_s, marker=".", color=COLORS.get(d["spec"]["label"]),
                label=d["spec"]["label"], ls="--" if peer else "-")  # fmt: skip
    events = [e[0] for e in runs[0]["spec"]["events"]]
    if len(events) >= 2:
        ax.axvspan(events[0], events[1], color="grey", alpha=0.15, label="64 workers")
    k = runs[0]["spec"]["k"]
    ax.set(xlabel="seconds", ylabel=f"served per second (rates / k, k = {k:g})",
           title="capacity swing: requests served within deadline per second")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(docs: list[dict[str, Any]], img: Path) -> list[Path]:
    """Every plot into ``img``; returns the files written."""
    img.mkdir(parents=True, exist_ok=True)
    paths = [img / "exp_sweep.png", img / "exp_degrade.png", img / "exp_swing.png",
             img / "exp_swing_served.png"]  # fmt: skip
    plot_sweep(docs, paths[0])
    plot_limits(docs, "degrade", paths[1], "upstream 5x slower in the shaded third (2x offered)")
    plot_limits(docs, "swing", paths[2], "workers 8 -> 64 (shaded) -> 8, 1,600 rps offered")
    plot_swing_served(docs, paths[3])
    return [p for p in paths if p.exists()]
