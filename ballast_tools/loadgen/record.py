"""What happened to each request: classification, tallies, timelines, JSONL (pure).

Every scheduled request ends in exactly one outcome:

- ``served``: a 2xx that completed within the tier's deadline (latency from the
  *intended* send time <= deadline).
- ``shed``: the response carried ``X-Ballast-Reason`` (the detail is the reason).
- ``expired``: the client-side deadline passed: a 2xx that came back late
  (``late``), a local timeout at deadline + grace (``timeout``), or a 504 from
  the gateway, whose forwarded budget ran out (``504``).
- ``error``: any other status (``status:NNN``) or a transport error (its class name).
- ``not_issued``: the generator did not send it: it was more than ``max_lag_s``
  behind schedule or past the deadline already (``behind``), or at the in-flight
  cap (``inflight_cap``). These are the generator's failures, reported apart.

Latency is ``completion - intended`` for every issued request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import IO

from ballast_tools.hist import Histogram
from ballast_tools.loadgen.schedule import Tier


class Outcome(StrEnum):
    """Final state of one scheduled request."""

    SERVED = "served"
    SHED = "shed"
    EXPIRED = "expired"
    ERROR = "error"
    NOT_ISSUED = "not_issued"


#: Per-second timeline columns, in order.
TIMELINE_FIELDS = ("sent", "served", "shed", "expired", "error", "not_issued")
_COLUMN = {name: i for i, name in enumerate(TIMELINE_FIELDS)}


def classify(
    status: int, reason: str | None, latency_s: float, deadline_s: float
) -> tuple[Outcome, str]:
    """Outcome and detail of a request that got a response."""
    if 200 <= status < 300:
        if latency_s <= deadline_s:
            return Outcome.SERVED, ""
        return Outcome.EXPIRED, "late"
    if reason:
        return Outcome.SHED, reason
    if status == 504:
        return Outcome.EXPIRED, "504"
    return Outcome.ERROR, f"status:{status}"


@dataclass(slots=True)
class Record:
    """One scheduled request (times in seconds; lag/latency are nan if not issued)."""

    tier: str
    intended_s: float
    lag_s: float
    latency_s: float
    status: int
    outcome: Outcome
    detail: str

    def to_json(self) -> str:
        """One JSONL line (milliseconds for durations)."""
        return json.dumps(
            {
                "tier": self.tier,
                "intended_s": round(self.intended_s, 6),
                "lag_ms": None if self.lag_s != self.lag_s else round(self.lag_s * 1e3, 3),
                "latency_ms": (
                    None if self.latency_s != self.latency_s else round(self.latency_s * 1e3, 3)
                ),
                "status": self.status,
                "outcome": str(self.outcome),
                "detail": self.detail,
            }
        )


@dataclass
class TierTally:
    """Counts and latency histograms for one tier."""

    sent: int = 0
    served: int = 0
    expired: int = 0
    errors: int = 0
    not_issued: int = 0
    shed: dict[str, int] = field(default_factory=dict)
    expired_by: dict[str, int] = field(default_factory=dict)
    errors_by: dict[str, int] = field(default_factory=dict)
    not_issued_by: dict[str, int] = field(default_factory=dict)
    latency_served_s: Histogram = field(default_factory=Histogram)
    latency_all_s: Histogram = field(default_factory=Histogram)

    @property
    def shed_total(self) -> int:
        """Shed responses, all reasons."""
        return sum(self.shed.values())


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


class RunStats:
    """Tallies per tier, schedule lag, a per-second timeline and a live window."""

    def __init__(self, tiers: tuple[Tier, ...]) -> None:
        self.tiers = tiers
        self.tally = [TierTally() for _ in tiers]
        self.lag_s = Histogram()
        #: timeline[second][tier][column]; sent/not_issued by intended second,
        #: outcomes by completion second.
        self.timeline: list[list[list[int]]] = []
        self.window_served_s = [Histogram() for _ in tiers]

    def _tick(self, second: float, tier: int, column: str) -> None:
        s = max(0, int(second))
        while len(self.timeline) <= s:
            self.timeline.append([[0] * len(TIMELINE_FIELDS) for _ in self.tiers])
        self.timeline[s][tier][_COLUMN[column]] += 1

    def issued(self, tier: int, intended_s: float, lag_s: float) -> None:
        """A request left on its way (``lag_s`` behind its intended time)."""
        self.tally[tier].sent += 1
        self.lag_s.record(lag_s)
        self._tick(intended_s, tier, "sent")

    def not_issued(self, tier: int, intended_s: float, why: str) -> None:
        """A request the generator could not send."""
        t = self.tally[tier]
        t.not_issued += 1
        _bump(t.not_issued_by, why)
        self._tick(intended_s, tier, "not_issued")

    def completed(
        self, tier: int, end_s: float, latency_s: float, outcome: Outcome, detail: str
    ) -> None:
        """An issued request finished (``end_s`` from the run start)."""
        t = self.tally[tier]
        t.latency_all_s.record(latency_s)
        if outcome is Outcome.SERVED:
            t.served += 1
            t.latency_served_s.record(latency_s)
            self.window_served_s[tier].record(latency_s)
        elif outcome is Outcome.SHED:
            _bump(t.shed, detail)
        elif outcome is Outcome.EXPIRED:
            t.expired += 1
            _bump(t.expired_by, detail)
        else:
            t.errors += 1
            _bump(t.errors_by, detail)
        self._tick(end_s, tier, str(outcome))

    def take_window(self) -> list[Histogram]:
        """Served-latency histograms since the last call (for a live view)."""
        window, self.window_served_s = self.window_served_s, [Histogram() for _ in self.tiers]
        return window

    def timeline_dicts(self) -> list[dict[str, dict[str, int]]]:
        """The timeline as ``[{tier: {column: n}}]``, one entry per second."""
        return [
            {
                tier.name: dict(zip(TIMELINE_FIELDS, row[i], strict=True))
                for i, tier in enumerate(self.tiers)
            }
            for row in self.timeline
        ]


def write_jsonl(records: Iterable[Record], out: IO[str]) -> int:
    """Write one JSON object per line; returns the count."""
    n = 0
    for rec in records:
        out.write(rec.to_json())
        out.write("\n")
        n += 1
    return n
