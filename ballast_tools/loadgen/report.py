"""Per-tier summary of a run: a JSON-safe dict and a text table.

Latency percentiles are from each request's intended send time, over the
served requests (``latency_served_ms``) and over every completed request
(``latency_all_ms``: served, shed, expired and errors together). Durations
in the summary are milliseconds.
"""

from __future__ import annotations

import math
import platform
import sys
from typing import Any

import aiohttp

from ballast_tools.hist import Histogram
from ballast_tools.loadgen.record import TierTally
from ballast_tools.loadgen.runner import RunResult

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def _ms(h: Histogram) -> dict[str, float | int | None]:
    out: dict[str, float | int | None] = {"count": h.count}
    for key, value in h.percentiles(PERCENTILES).items():
        out[key] = None if math.isnan(value) else round(value * 1e3, 3)
    out["max"] = round(h.max * 1e3, 3) if h.count else None
    return out


def tier_summary(t: TierTally) -> dict[str, Any]:
    """One tier's counts and latency percentiles."""
    return {
        "sent": t.sent,
        "served": t.served,
        "shed": t.shed_total,
        "shed_by_reason": dict(sorted(t.shed.items())),
        "expired": t.expired,
        "expired_by": dict(sorted(t.expired_by.items())),
        "errors": t.errors,
        "errors_by": dict(sorted(t.errors_by.items())),
        "not_issued": t.not_issued,
        "not_issued_by": dict(sorted(t.not_issued_by.items())),
        "latency_served_ms": _ms(t.latency_served_s),
        "latency_all_ms": _ms(t.latency_all_s),
    }


def generator_summary(result: RunResult) -> dict[str, Any]:
    """How well the generator itself kept up."""
    sent = sum(t.sent for t in result.stats.tally)
    not_issued = sum(t.not_issued for t in result.stats.tally)
    return {
        "scheduled": result.scheduled,
        "sent": sent,
        "not_issued": not_issued,
        "achieved_rps": round(sent / result.config.duration_s, 1),
        "schedule_lag_ms": _ms(result.stats.lag_s),
        "cpu_s": round(result.cpu_s, 3),
        "wall_s": round(result.wall_s, 3),
        "cpu_us_per_request": round(result.cpu_us_per_request, 1) if sent else None,
        "gc_paused": result.config.pause_gc,
        "gc_forced_collections": result.gc_collections,
        "warm_connections": result.config.warm_connections,
    }


def summarize(result: RunResult) -> dict[str, Any]:
    """The whole run as one JSON-safe document."""
    cfg = result.config
    return {
        "config": {
            "target": cfg.target,
            "rate_rps": cfg.rate_rps,
            "duration_s": cfg.duration_s,
            "poisson": cfg.poisson,
            "seed": cfg.seed,
            "tiers": [
                {"name": t.name, "weight": t.weight, "deadline_ms": t.deadline_s * 1e3}
                for t in cfg.tiers
            ],
            "max_inflight": cfg.max_inflight,
            "max_lag_ms": cfg.max_lag_s * 1e3,
            "grace_ms": cfg.grace_s * 1e3,
        },
        "started_unix_s": round(result.started_unix_s, 3),
        "versions": {"python": sys.version.split()[0], "aiohttp": aiohttp.__version__},
        "machine": platform.platform(),
        "generator": generator_summary(result),
        "tiers": {
            tier.name: tier_summary(t)
            for tier, t in zip(result.stats.tiers, result.stats.tally, strict=True)
        },
        "timeline": result.stats.timeline_dicts(),
    }


def _fmt(v: float | int | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_table(summary: dict[str, Any]) -> str:
    """A fixed-width per-tier table plus the generator's own health line."""
    head = (
        f"{'tier':<9}{'sent':>8}{'served':>8}{'shed':>8}{'expired':>8}{'errors':>7}"
        f"{'not_iss':>8}{'p50':>9}{'p90':>9}{'p99':>9}{'p99.9':>9}  (ms, served)"
    )
    lines = [head, "-" * len(head)]
    for name, t in summary["tiers"].items():
        lat = t["latency_served_ms"]
        lines.append(
            f"{name:<9}{t['sent']:>8}{t['served']:>8}{t['shed']:>8}{t['expired']:>8}"
            f"{t['errors']:>7}{t['not_issued']:>8}{_fmt(lat['p50']):>9}{_fmt(lat['p90']):>9}"
            f"{_fmt(lat['p99']):>9}{_fmt(lat['p99.9']):>9}"
        )
    for name, t in summary["tiers"].items():
        if t["shed_by_reason"] or t["expired_by"] or t["errors_by"]:
            lines.append(
                f"  {name}: shed {t['shed_by_reason']} expired {t['expired_by']} "
                f"errors {t['errors_by']}"
            )
    g = summary["generator"]
    lag = g["schedule_lag_ms"]
    lines.append(
        f"generator: {g['sent']}/{g['scheduled']} sent ({g['achieved_rps']} rps), "
        f"not issued {g['not_issued']}, lag p50 {_fmt(lag['p50'])} p99 {_fmt(lag['p99'])} "
        f"max {_fmt(lag['max'])} ms, cpu {g['cpu_s']} s ({_fmt(g['cpu_us_per_request'])} us/req)"
    )
    return "\n".join(lines)
