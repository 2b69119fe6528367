"""Turn one run's records into the numbers of the tables: admitted vs a perfect bucket,
latency, Redis trips and where decisions came from."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ballast_asgi.ratelimit.core.gcra import Limits, ReferenceBucket
from experiments.ratelimit.drive import Result


@dataclass
class Admission:
    """What got through compared with a perfect single bucket over the same requests."""

    issued: int
    admitted: int
    perfect: int
    #: Admitted here but refused by the perfect bucket (over the limit).
    over: int
    #: Refused here but admitted by the perfect bucket (good requests turned away).
    under: int
    #: Neither 200 nor a rate-limit 429 (client timeout, error, other shed): not compared.
    other: int
    #: What the perfect bucket admitted among the requests that got an answer.
    perfect_answered: int = 0

    @property
    def net_pct(self) -> float:
        """Among answered requests, (over - under) / perfect, in percent: plus over the limit."""
        return 100.0 * (self.over - self.under) / max(1, self.perfect_answered)

    @property
    def over_pct(self) -> float:
        """Requests admitted over the limit, percent of what the perfect bucket admitted."""
        return 100.0 * self.over / max(1, self.perfect_answered)


def perfect_replay(results: Sequence[Result], limits: Limits) -> dict[int, bool]:
    """Replay every issued request, in intended order, through one bucket per key."""
    buckets: dict[str, ReferenceBucket] = {}
    verdict: dict[int, bool] = {}
    for i, r in sorted(enumerate(results), key=lambda ir: ir[1].offset_s):
        if r.status == -1:
            continue
        bucket = buckets.get(r.key)
        if bucket is None:
            bucket = buckets[r.key] = ReferenceBucket(limits, r.offset_s)
        verdict[i] = bucket.take(r.offset_s)
    return verdict


def admission(
    results: Sequence[Result], limits: Limits, window: tuple[float, float] | None = None
) -> Admission:
    """Admitted vs perfect, optionally only for requests intended inside ``window``."""
    verdict = perfect_replay(results, limits)
    issued = admitted = perfect = over = under = other = answered = 0
    for i, r in enumerate(results):
        if i not in verdict or (window and not window[0] <= r.offset_s < window[1]):
            continue
        issued += 1
        ours = r.status == 200
        refused = r.status == 429 and r.reason == "rate_limited"
        if not ours and not refused:
            other += 1
        else:
            answered += verdict[i]
        admitted += ours
        perfect += verdict[i]
        over += ours and not verdict[i]
        under += refused and verdict[i]
    return Admission(issued, admitted, perfect, over, under, other, answered)


def latency_ms(results: Sequence[Result], q: float) -> float:
    """Quantile ``q`` of the 200 responses' latency (from the intended send time), ms."""
    values = sorted(r.latency_s for r in results if r.status == 200)
    if not values:
        return math.nan
    return 1000.0 * values[min(len(values) - 1, int(q * len(values)))]


def lag_ms(results: Sequence[Result], q: float) -> float:
    """Quantile ``q`` of the generator's own lag, ms."""
    values = sorted(r.lag_s for r in results)
    return 1000.0 * values[min(len(values) - 1, int(q * len(values)))] if values else math.nan


def not_issued(results: Sequence[Result]) -> int:
    """Requests the generator could not send on time."""
    return sum(r.status == -1 for r in results)


def delta(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, float]:
    """Decisions by source and Redis round trips made during a run, both gateways summed."""
    out: dict[str, float] = {"decisions": 0, "local": 0, "redis": 0, "degraded": 0, "trips": 0}
    for b, a in zip(before, after, strict=True):
        if a is None or b is None:
            continue
        for name, n in a["decisions"].items():
            diff = n - b["decisions"].get(name, 0)
            out["decisions"] += diff
            out[name.split("/")[1]] += diff
        for name, n in a["redis_calls"].items():
            if not name.endswith("/late"):
                out["trips"] += n - b["redis_calls"].get(name, 0)
    return out


def waits_over(
    before: list[dict[str, Any]], after: list[dict[str, Any]], bound_s: float
) -> tuple[int, int]:
    """Decisions during a run that waited longer than ``bound_s`` (a histogram bound), and all."""
    over = total = 0
    for b, a in zip(before, after, strict=True):
        if a is None or b is None:
            continue
        for edge, n in a["decision_wait"]["buckets_s"].items():
            diff = n - b["decision_wait"]["buckets_s"].get(edge, 0)
            total += diff
            over += diff if float(edge) > bound_s else 0
    return over, total


def median_range(values: Sequence[float]) -> str:
    """``median (min..max)`` for repeated runs, one value as itself."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}..{max(values):.2f})"
