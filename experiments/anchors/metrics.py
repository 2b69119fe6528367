"""The anchors' numbers from a run's per-request records and limit samples (pure).

A record is ``(intended_s, tier, outcome, latency_s)``: the request's intended
send time from the load's start, its tier index (0 critical, 1 standard, 2
bulk), the generator's outcome (``served`` = a 2xx within the tier's
deadline, ``shed``, ``expired``, ``error``, ``not_issued``) and its latency
from the intended time (NaN when not issued). ``windows`` puts requests in
windows by their *intended* send time (what was offered during the window and
everything that became of it) or by their *completion* (intended + latency:
what came out during the window; a request not issued stays at its intended
time). Goodput by completion is the backend's useful throughput; by intended
time it would count, for a short window, requests served seconds later.

- *Goodput*: served requests per second (within their deadlines).
- *Admitted*: issued and not shed (served, expired or error). "Admitted p99
  within the deadline" is a window where at least 99 % of the admitted
  requests were served: each tier's p99 / deadline <= 1 (tiers have
  different deadlines, so it is a share, not one latency).
- *Converged at*: the start of the first window from which every later
  window of the run is good (goodput at or above the bar, admitted p99
  within the deadline). ``None``: the run ended in a bad window.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Rec = tuple[float, int, str, float]
#: Admitted requests that must be served for "admitted p99 within the deadline".
P99_SHARE = 0.99
#: A limit sample: [t_s, limit, inflight, queue, answer_ms, probing, loop_lag_ms]
#: (``experiments.sweep.one.sample_snapshots``).
Sample = Sequence[float]


@dataclass(frozen=True)
class Window:
    """Requests intended in ``[start_s, start_s + width_s)``."""

    start_s: float
    width_s: float
    offered: int
    issued: int
    admitted: int
    served: int

    @property
    def goodput_rps(self) -> float:
        """Served per second."""
        return self.served / self.width_s

    @property
    def admitted_ok(self) -> bool:
        """At least ``P99_SHARE`` of the admitted requests were served (0 admitted: no)."""
        return self.admitted > 0 and self.served >= P99_SHARE * self.admitted

    @property
    def success(self) -> float:
        """Served / issued (1.0 when nothing was issued)."""
        return self.served / self.issued if self.issued else 1.0


def _prefix(flags: Iterable[bool]) -> list[int]:
    out = [0]
    for f in flags:
        out.append(out[-1] + int(f))
    return out


def windows(
    recs: Sequence[Rec], t0: float, t1: float, width_s: float, step_s: float,
    tiers: frozenset[int] | None = None, *, by_completion: bool = False,
) -> list[Window]:  # fmt: skip
    """Windows ``[s, s + width)`` for ``s = t0, t0 + step, ...`` while ``s + width <= t1``."""
    if width_s <= 0 or step_s <= 0:
        raise ValueError("width_s and step_s must be > 0")
    rows = sorted((_at(r, by_completion), *r[1:]) for r in recs if tiers is None or r[1] in tiers)
    times = [r[0] for r in rows]
    issued = _prefix(r[2] != "not_issued" for r in rows)
    admitted = _prefix(r[2] in ("served", "expired", "error") for r in rows)
    served = _prefix(r[2] == "served" for r in rows)
    out: list[Window] = []
    n = 0
    while True:
        s = t0 + n * step_s
        if s + width_s > t1 + 1e-9:
            return out
        i, j = bisect.bisect_left(times, s - 1e-9), bisect.bisect_left(times, s + width_s - 1e-9)
        out.append(Window(round(s, 6), width_s, j - i, issued[j] - issued[i],
                          admitted[j] - admitted[i], served[j] - served[i]))  # fmt: skip
        n += 1


def _at(r: Rec, by_completion: bool) -> float:
    """The time a record counts at: intended, or completed (intended when not issued)."""
    if by_completion and not math.isnan(r[3]):
        return r[0] + r[3]
    return r[0]


def _good(w: Window, goodput_min_rps: float) -> bool:
    return w.goodput_rps >= goodput_min_rps and w.admitted_ok


def first_good(wins: Sequence[Window], goodput_min_rps: float) -> tuple[float | None, int]:
    """Start of the first good window, and how many bad windows come after it."""
    first = next((i for i, w in enumerate(wins) if _good(w, goodput_min_rps)), None)
    if first is None:
        return None, 0
    bad = sum(1 for w in wins[first:] if not _good(w, goodput_min_rps))
    return wins[first].start_s, bad


def converged_at(wins: Sequence[Window], goodput_min_rps: float) -> float | None:
    """Start of the first window from which every later one is good; None if the last is bad."""
    last_bad = -1
    for i, w in enumerate(wins):
        if not _good(w, goodput_min_rps):
            last_bad = i
    if not wins or last_bad == len(wins) - 1:
        return None
    return wins[last_bad + 1].start_s


def goodput_rps(recs: Sequence[Rec], t0: float, t1: float) -> float:
    """Served per second among requests completed in ``[t0, t1)``."""
    n = sum(1 for r in recs if r[2] == "served" and t0 <= r[0] + r[3] < t1)
    return n / (t1 - t0) if t1 > t0 else math.nan


def tier_counts(recs: Sequence[Rec], tier: int, t0: float, t1: float) -> dict[str, int]:
    """Outcome counts of one tier's requests intended in ``[t0, t1)``."""
    out = {"offered": 0, "served": 0, "shed": 0, "expired": 0, "error": 0, "not_issued": 0}
    for r in recs:
        if r[1] == tier and t0 <= r[0] < t1:
            out["offered"] += 1
            out[r[2]] = out.get(r[2], 0) + 1
    return out


def served_share(counts: dict[str, int]) -> float | None:
    """Served / issued (not issued is the generator's failure, reported apart)."""
    issued = counts["offered"] - counts["not_issued"]
    return counts["served"] / issued if issued else None


def worst_window(wins: Sequence[Window]) -> Window | None:
    """The window with the lowest success (the earliest of equals)."""
    return min(wins, key=lambda w: w.success) if wins else None


def limit_at(samples: Sequence[Sample], t_s: float) -> float | None:
    """The last sampled limit at or before ``t_s``."""
    before = [s[1] for s in samples if s[0] <= t_s]
    return before[-1] if before else None


def drift(samples: Sequence[Sample], after_s: float, band: float = 0.2) -> dict[str, Any]:
    """How far the limit strays from its median after ``after_s``.

    ``within`` is the share of samples within ``band`` of the median; the
    same over the samples outside probes (``steady_within``), since a probe
    pins the limit low on purpose for a moment.
    """
    rows = [s for s in samples if s[0] >= after_s]
    limits = [float(s[1]) for s in rows]
    steady = [float(s[1]) for s in rows if not (len(s) > 5 and s[5])]
    if not limits:
        return {"n": 0, "median": None, "min": None, "max": None, "within": None,
                "steady_within": None, "probe_share": None}  # fmt: skip
    med = statistics.median(limits)

    def share(vals: list[float]) -> float | None:
        if not vals:
            return None
        return sum(1 for v in vals if abs(v - med) <= band * med) / len(vals)

    return {"n": len(limits), "median": med, "min": min(limits), "max": max(limits),
            "within": share(limits), "steady_within": share(steady),
            "steady_min": min(steady) if steady else None,
            "steady_max": max(steady) if steady else None,
            "probe_share": 1 - len(steady) / len(limits)}  # fmt: skip


def rss_growth(rss: Sequence[Sequence[float]], after_s: float) -> dict[str, Any]:
    """Gateway RSS (kB) at the first sample at or after ``after_s`` and at the last one."""
    rows = [r for r in rss if r[0] >= after_s]
    if len(rows) < 2:
        return {"start_kb": None, "end_kb": None, "growth": None, "peak_kb": None}
    start, end = rows[0][1], rows[-1][1]
    return {"start_kb": start, "end_kb": end, "growth": (end - start) / start if start else None,
            "peak_kb": max(r[1] for r in rows)}  # fmt: skip


def reaction_s(samples: Sequence[Sample], t_event: float, drop: float = 0.2) -> float | None:
    """Seconds from ``t_event`` until the limit is ``drop`` below its value at ``t_event``."""
    before = limit_at(samples, t_event)
    if before is None:
        return None
    for s in samples:
        if s[0] > t_event and s[1] <= (1 - drop) * before:
            return s[0] - t_event
    return None
