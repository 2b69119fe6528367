"""Per-period counts for the two versions, and the stable version's latency baseline.

The judges never see single requests: the gateway cuts time into short blocks
(``block_s``, 1 s by default) and hands each finished ``Block`` to the judge,
and the simulation builds the same blocks from counts. A request counts as
*slow* when it succeeded and took longer than the stable version's recent
``quantile`` (p99 by default), a threshold computed from *previous* blocks
only, so both versions are measured against the same line in each block.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass


class Version(enum.StrEnum):
    """Which version served a request (the ``X-Ballast-Version`` header value)."""

    STABLE = "stable"
    CANARY = "canary"


@dataclass(frozen=True, slots=True)
class Block:
    """What both versions did in one period ``[start, end)`` (monotonic seconds)."""

    start: float
    end: float
    requests_c: int = 0
    requests_s: int = 0
    errors_c: int = 0
    errors_s: int = 0
    #: Successful requests measured against the latency threshold.
    timed_c: int = 0
    timed_s: int = 0
    slow_c: int = 0
    slow_s: int = 0


_LOW_S = 1e-4
_STEP = math.log(1.05)
_BUCKETS = 284  # 0.1 ms .. ~100 s in 5 % steps


def _bucket(latency_s: float) -> int:
    if latency_s <= _LOW_S:
        return 0
    return min(_BUCKETS - 1, int(math.log(latency_s / _LOW_S) / _STEP))


def _upper_edge(bucket: int) -> float:
    return _LOW_S * math.exp((bucket + 1) * _STEP)


class LatencyBaseline:
    """The stable version's latency quantile over the last ``window`` blocks (5 % buckets)."""

    def __init__(self, *, quantile: float = 0.99, window: int = 30, min_samples: int = 200) -> None:
        if not 0.5 <= quantile < 1.0:
            raise ValueError(f"quantile must be in [0.5, 1), got {quantile}")
        self.quantile = quantile
        self.min_samples = min_samples
        self._blocks: deque[dict[int, int]] = deque(maxlen=window)
        self._merged = [0] * _BUCKETS
        self._total = 0
        self._current: dict[int, int] = {}
        #: Latencies above this are slow (None until enough stable samples were seen).
        self.threshold_s: float | None = None

    def add(self, latency_s: float) -> None:
        """Count one successful stable request in the current block."""
        b = _bucket(latency_s)
        self._current[b] = self._current.get(b, 0) + 1

    def roll(self) -> None:
        """Close the current block and recompute the threshold for the next one."""
        if len(self._blocks) == self._blocks.maxlen:
            for b, n in self._blocks[0].items():
                self._merged[b] -= n
                self._total -= n
        self._blocks.append(self._current)
        for b, n in self._current.items():
            self._merged[b] += n
            self._total += n
        self._current = {}
        self.threshold_s = self._compute()

    def _compute(self) -> float | None:
        if self._total < self.min_samples:
            return None
        rank = self.quantile * self._total
        seen = 0
        for b, n in enumerate(self._merged):
            seen += n
            if seen >= rank:
                return _upper_edge(b)
        return _upper_edge(_BUCKETS - 1)


class BlockRecorder:
    """Counts requests per version into the current block."""

    def __init__(self, baseline: LatencyBaseline, start: float) -> None:
        self.baseline = baseline
        self._start = start
        self._counts = [0] * 8

    @property
    def start(self) -> float:
        """When the current block began."""
        return self._start

    def record(self, version: Version, failed: bool, latency_s: float | None) -> None:
        """One finished attempt: ``failed`` for 5xx/connect/timeout; latency for successes."""
        side = 1 if version is Version.STABLE else 0
        c = self._counts
        c[side] += 1
        if failed:
            c[2 + side] += 1
            return
        if latency_s is None:
            return
        if side:
            self.baseline.add(latency_s)
        threshold = self.baseline.threshold_s
        if threshold is not None:
            c[4 + side] += 1
            c[6 + side] += latency_s > threshold

    def close(self, now: float) -> Block:
        """Finish the current block at ``now`` and start the next one."""
        block = Block(self._start, now, *self._counts)
        self._counts = [0] * 8
        self._start = now
        self.baseline.roll()
        return block


__all__ = ["Block", "BlockRecorder", "LatencyBaseline", "Version"]
