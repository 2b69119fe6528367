"""Repetitions: every cell is the median of its runs, with the range shown.

Runs of one cell share (scenario, row label, load multiple). The cell's
numbers (critical p99, served counts, ...) are the medians over its runs and
``m["range"][key]`` holds (lowest, highest); what cannot be averaged (the limit's
range, served per third, shed reasons) comes from the cell's *median run*: the
run whose headline number (critical p99 in the sweep, critical served in the
degrade scenario, all served in the swing) is the median. A flag raised by any
run is shown on the cell.
"""

from __future__ import annotations

import statistics
from typing import Any

from experiments.sweep.metrics import metrics

Key = tuple[str, str, float]
NUMERIC = ("critical_p99_ms", "critical_p99_served_ms", "critical_served", "critical_sent",
           "served_total", "sent_total", "sim_late", "sim_served", "gateway_cpu_share",
           "rss_peak_mb")  # fmt: skip
HEADLINE = {"sweep": "critical_p99_ms", "degrade": "critical_served", "swing": "served_total"}


def cell_key(doc: dict[str, Any]) -> Key:
    """(scenario, row label, load multiple) of one run."""
    s = doc["spec"]
    return s["scenario"], s["label"], s["load_x"]


def group(docs: list[dict[str, Any]]) -> dict[Key, list[dict[str, Any]]]:
    """Runs by cell, in run order."""
    out: dict[Key, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(cell_key(d), []).append(d)
    return out


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose headline number is the median of the cell's (lower middle if even)."""
    key = HEADLINE.get(runs[0]["spec"]["scenario"], "critical_p99_ms")
    ordered = sorted(runs, key=lambda d: metrics(d)[key] or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def _median(values: list[Any]) -> Any:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    mid = statistics.median(vals)
    return round(mid) if all(isinstance(v, int) for v in vals) else mid


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell's metrics: medians with ranges, the rest from the median run."""
    ms = [metrics(d) for d in runs]
    out = metrics(median_run(runs))
    out["n"] = len(runs)
    out["range"] = {}
    for key in NUMERIC:
        vals = [m[key] for m in ms if m[key] is not None]
        out[key] = _median(vals)
        out["range"][key] = (min(vals), max(vals)) if vals else None
    flags = sorted({f for m in ms for f in m["bottleneck"]["flags"]})
    out["bottleneck"] = {**out["bottleneck"], "flags": flags}
    out["merged"] = any(d.get("merged_from") for d in runs)
    return out


def merge(
    docs: list[dict[str, Any]], older: list[dict[str, Any]], source: str
) -> tuple[list[dict[str, Any]], int]:
    """``docs`` plus the cells of ``older`` that ``docs`` lacks or has fewer runs of.

    Never fewer measurements: a cell of ``docs`` gives way only to one with more
    repetitions. The runs taken from ``older`` carry ``merged_from = source``.
    Returns the runs and how many cells came from ``older``.
    """
    mine, theirs = group(docs), group(older)
    taken = {key for key, runs in theirs.items() if len(runs) > len(mine.get(key, []))}
    out = [d for d in docs if cell_key(d) not in taken]
    out += [{**d, "merged_from": source} for d in older if cell_key(d) in taken]
    return out, len(taken)


def representatives(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The median run of every cell (what the plots draw)."""
    return [median_run(runs) for runs in group(docs).values()]


def spread_text(m: dict[str, Any], key: str, unit: str = "") -> str:
    """`` (lo-hi unit)`` when the cell has more than one run, else ``""``."""
    rng = m.get("range", {}).get(key)
    if m.get("n", 1) < 2 or rng is None:
        return ""
    lo, hi = rng
    return f" ({lo:,.0f}-{hi:,.0f}{unit})"
