"""Tables of the pool experiment (medians of the repetitions), as Markdown."""

from __future__ import annotations

import statistics
import sys
from typing import Any

from experiments.pool import analysis


def _iso(v: float | None, break_s: float) -> str:
    return f"> {break_s:g} s" if v is None else f"{v * 1000:.0f} ms"


def cell(runs: list[dict[str, Any]], break_s: float) -> str:
    """``failed (late) / isolation`` (medians) for one cell."""
    failed = statistics.median(r["failed"] for r in runs)
    late = statistics.median(r["late"] for r in runs)
    iso = analysis.median([r["isolation_s"] for r in runs])
    return f"{failed:g} ({late:g}) / {_iso(iso, break_s)}"


def progress(label: str, runs: list[dict[str, Any]]) -> None:
    """One line per finished cell on stderr."""
    r = runs[-1]
    print(f"{label}: failed {[x['failed'] for x in runs]} late {[x['late'] for x in runs]} "
          f"isolation "
          f"{[x['isolation_s'] for x in runs]} touched {r['touched']} "
          f"not_issued {r['not_issued_total']}", file=sys.stderr)  # fmt: skip


def breaks_table(doc: dict[str, Any]) -> str:
    """Part 1: failed requests in the break / time to < 1 % of traffic, per fault and column."""
    breaks, b = doc["breaks"], doc["meta"]["break_s"]
    if not breaks:
        return ""
    cols = list(next(iter(breaks.values())))
    lines = ["| broken instance | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for fault, by_col in breaks.items():
        lines.append(f"| {fault} | " + " | ".join(cell(by_col[c], b) for c in cols) + " |")
    return "\n".join(lines)


def settings_table(doc: dict[str, Any]) -> str:
    """Part 2: one setting at a time from the all-on default."""
    b = doc["meta"]["break_s"]
    lines = ["| setting | value | failed / isolation | touched |", "|---|---|---|---|"]
    for label, by_value in doc["settings"].items():
        for value, runs in by_value.items():
            touched = statistics.median(r["touched"] for r in runs)
            lines.append(f"| {label} | {value} | {cell(runs, b)} | {touched:.2%} |")
    return "\n".join(lines) if doc["settings"] else ""


def quiet_line(doc: dict[str, Any]) -> str:
    """Part 3: false ejections with nothing broken."""
    runs = doc["quiet"]
    if not runs:
        return ""
    false = [sum(r["ejections"]) + sum(r["unhealthy_probes"]) for r in runs]
    failed = [r["failed_total"] for r in runs]
    late = [r["late_total"] for r in runs]
    sent = [r["sent_total"] for r in runs]
    return (f"False ejections over {len(runs)} runs of {doc['meta']['quiet_s']:g} s: "
            f"median {statistics.median(false):g}, max {max(false)} (ejections plus probe "
            f"failures). Per run: sent {sent}, failed {failed} (the 1 % injected 500s), "
            f"late {late}.")  # fmt: skip


def markdown(doc: dict[str, Any]) -> str:
    """All three parts."""
    m = doc["meta"]
    head = (f"Offered {m['rate_rps']:g} rps over three instances; instance 0 broken for "
            f"{m['break_s']:g} s after {m['warm_s']:g} s; medians of {m['reps']} runs; "
            f"wall time {m['wall_s']:g} s.")  # fmt: skip
    parts = [head, "### When an instance breaks: failed (late) / time to < 1 % of traffic",
             breaks_table(doc), f"### One setting at a time (fault: {m['settings_fault']})",
             settings_table(doc), "### Nothing broken", quiet_line(doc)]  # fmt: skip
    return "\n\n".join(p for p in parts if p) + "\n"
