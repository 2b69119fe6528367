"""The stable instances' history: do their errors come in bursts? (a warm start for the judge).

The sequential judge's per-block cap (``evidence.py``) exists for one reason:
errors on an instance may come in bursts, and a burst on the canary's
instance looks like a short regression. Whether bursts happen is something
the gateway can *learn* from the stable version, which it has served (per
instance: the pool knows which instance answered each attempt) since before
the canary began. This module keeps that history and answers one question:
are the stable instances' event counts overdispersed?

**History.** Per stable instance, counts of requests and events (errors; and
successes measured against the latency line, and slow ones) per window of
``window_s`` seconds, for the last ``history_s`` seconds (a ring of windows,
all instances in each). It keeps recording before and while a canary runs.

**The test.** Over the instance-windows with traffic, with ``p`` the pooled
event rate, the Pearson dispersion statistic standardised with the binomial
variance of each term::

    z = sum_j[(E_j - N_j p)^2 / (N_j p (1 - p)) - 1] / sqrt(sum_j (2 + 1 / (N_j p (1 - p))))

is about N(0, 1) when every request fails independently at one rate, and
large when an instance's rate moves in time (bursts, on/off episodes): a 5 %
ON time at 10x the rate gives z of 4 to 1,500 over 10 minutes in the
simulation's cells, where independent errors stay under 2.33 in 99 % of them.

**The regime** (``undecided``, ``calm`` or ``bursty``) is decided once, from
history complete before the block it first applies to: ``undecided`` while
the history covers less than ``history_s`` or holds fewer than
``min_events`` events (the judge keeps the burst cap: no history is treated
as bursty), then ``calm`` if ``z < burst_z`` and ``bursty`` otherwise, and it
stays. Validity: for independent errors any cap chosen from the past keeps
the e-process a supermartingale (``evidence.py``), so ``calm`` (no cap) and
``bursty`` (the cap) are both anytime-valid there, and the stable history
only decides how fast. Under bursts nothing is proved: the rate is measured
(docs/canary.md), and the test is what keeps bursty traffic on the cap.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class Regime(enum.StrEnum):
    """What the stable history says about bursts (per metric)."""

    UNDECIDED = "undecided"
    CALM = "calm"
    BURSTY = "bursty"


@dataclass(frozen=True, slots=True)
class HistoryParams:
    """How much stable history the judge learns from and how it reads it."""

    #: Seconds of stable history the test needs (and keeps).
    history_s: float = 600.0
    #: Counts per instance are pooled over windows of this many seconds.
    window_s: float = 5.0
    #: Dispersion z at or above this: the stable instances' events come in bursts.
    burst_z: float = 2.33
    #: Fewer events than this in the history: undecided (the judge keeps the cap).
    min_events: int = 200

    def __post_init__(self) -> None:
        if not 0.0 < self.window_s <= self.history_s:
            raise ValueError("need 0 < window_s <= history_s")
        if self.min_events < 1:
            raise ValueError(f"min_events must be >= 1, got {self.min_events}")

    @property
    def windows(self) -> int:
        """Windows in the history."""
        return max(1, round(self.history_s / self.window_s))


def dispersion_z(cells: Iterable[tuple[int, int]]) -> float | None:
    """The standardised Pearson dispersion of ``(requests, events)`` cells (None: no events)."""
    cells = [(n, e) for n, e in cells if n > 0]
    total_n = sum(n for n, _ in cells)
    total_e = sum(e for _, e in cells)
    if total_e == 0 or total_e == total_n:
        return None
    p = total_e / total_n
    num = var = 0.0
    for n, e in cells:
        v = n * p * (1.0 - p)
        num += (e - n * p) ** 2 / v - 1.0
        var += 2.0 + 1.0 / v
    return num / math.sqrt(var)


_METRICS = ("errors", "latency")


def _round(z: float | None) -> float | None:
    return None if z is None else round(z, 3)


class StableHistory:
    """Per-instance stable counts in windows; the burst regime per metric, decided once."""

    def __init__(self, params: HistoryParams, now: float) -> None:
        self.params = params
        self._ring: deque[dict[str, list[int]]] = deque(maxlen=params.windows)
        self._current: dict[str, list[int]] = {}
        self._window_start = now
        self._regimes = {m: Regime.UNDECIDED for m in _METRICS}
        self._z: dict[str, float | None] = {m: None for m in _METRICS}

    def record(self, instance: str, failed: bool, slow: bool | None, now: float) -> None:
        """One stable attempt on ``instance``; ``slow`` None when not measured against the line."""
        self.roll(now)
        c = self._current.setdefault(instance, [0, 0, 0, 0])
        c[0] += 1
        c[1] += failed
        if slow is not None:
            c[2] += 1
            c[3] += slow

    def roll(self, now: float) -> None:
        """Close every window that ended by ``now`` (empty ones too: idle time is history)."""
        w = self.params.window_s
        for _ in range(self.params.windows + 1):
            if now - self._window_start < w:
                return
            self._ring.append(self._current)
            self._current = {}
            self._window_start += w
        self._window_start = now  # idle for longer than the whole history

    @property
    def covered_s(self) -> float:
        """Seconds of complete windows in the history."""
        return len(self._ring) * self.params.window_s

    def cells(self, metric: str) -> Sequence[tuple[int, int]]:
        """``(requests, events)`` per instance-window of the complete history for one metric."""
        i = 0 if metric == "errors" else 2
        return [(c[i], c[i + 1]) for window in self._ring for c in window.values()]

    def decide(self, now: float) -> dict[str, Regime]:
        """Decide each undecided metric's regime from the complete windows (then it stays)."""
        self.roll(now)
        full = self.covered_s >= self.params.history_s - 1e-9
        for m in _METRICS:
            if self._regimes[m] is not Regime.UNDECIDED or not full:
                continue
            cells = self.cells(m)
            if sum(e for _, e in cells) < self.params.min_events:
                continue
            z = dispersion_z(cells)
            self._z[m] = z
            if z is not None:
                self._regimes[m] = Regime.CALM if z < self.params.burst_z else Regime.BURSTY
        return dict(self._regimes)

    def snapshot(self) -> dict[str, object]:
        """JSON-safe: coverage, instances seen and the regime (and z) per metric."""
        instances = {name for window in self._ring for name in window}
        doc: dict[str, object] = {"covered_s": self.covered_s, "instances": len(instances)}
        for m in _METRICS:
            z = self._z[m]
            doc[m] = {"regime": self._regimes[m].value, "dispersion_z": _round(z)}
        return doc


__all__ = ["HistoryParams", "Regime", "StableHistory", "dispersion_z"]
