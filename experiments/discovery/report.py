"""The experiment's summary: the headline numbers and the details behind them."""

from __future__ import annotations

import argparse
from typing import Any

from experiments._harness.machine import machine
from experiments._harness.stats import percentile
from experiments.discovery.analysis import Applied, latencies_ms
from experiments.discovery.events import Marks


def pct(values: list[float], p: float) -> float | None:
    """The harness's nearest-rank percentile, rounded; None for no values."""
    return round(percentile(values, p), 1) if values else None


def summarize(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    down: dict[str, Any],
    marks: Marks,
    applied: Applied,
    cpu: dict[str, Any],
) -> dict[str, Any]:
    """Headline numbers plus every run's row."""
    reg, reg_missing = latencies_ms(applied, marks.registered, present=True)
    rem, rem_missing = latencies_ms(applied, marks.deregistered, present=False)
    sent = sum(r["sent"] for r in rows)
    lost = sum(r["lost"] for r in rows)
    by_kind: dict[str, dict[str, int]] = {}
    for r in rows:
        k = by_kind.setdefault(r["kind"], {"runs": 0, "sent": 0, "lost": 0, "late": 0})
        for key, value in (("runs", 1), ("sent", r["sent"]), ("lost", r["lost"]),
                           ("late", r["late"])):  # fmt: skip
            k[key] += value
    losses = marks.lease_loss_versions
    headline = {
        "runs": len(rows),
        "run_s": args.run_s,
        "rate_rps": args.rate,
        "requests": sent,
        "lost": lost,
        "late_sends": sum(r["late"] for r in rows),
        "registration_to_applied_ms": {
            "n": len(reg),
            "p50": pct(reg, 50),
            "p99": pct(reg, 99),
            "max": pct(reg, 100),
            "never": reg_missing,
        },
        "deregistration_to_removed_ms": {
            "n": len(rem),
            "p50": pct(rem, 50),
            "p99": pct(rem, 99),
            "never": rem_missing,
        },
        "lease_losses": len(losses),
        "versions_per_lease_loss": (sum(losses) / len(losses)) if losses else None,
        "events": marks.counts,
        "by_event": by_kind,
        "cpu_cores": cpu,
        "etcd_down": {
            k: down[k] for k in ("etcd_down_s", "sent", "lost", "late", "register_after_restart_ms")
        },
    }
    return {
        "headline": headline,
        "machine": machine(),
        "runs": rows,
        "etcd_down_run": down,
        "registration_ms": sorted(round(x, 1) for x in reg),
    }
