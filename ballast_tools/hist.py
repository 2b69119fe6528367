"""A small log-linear histogram (pure): ~0.8% relative error, mergeable, serialisable.

The math. A positive value ``v`` is written ``v = m * 2**e`` with ``m`` in
``[0.5, 1)`` (``math.frexp``). Each power-of-two range ``[2**(e-1), 2**e)`` is
split into ``S`` equal-width linear sub-buckets (``S = 64`` by default)::

    sub   = floor((2*m - 1) * S)          # 0 .. S-1
    index = e * S + sub

Bucket ``index`` covers ``[(1 + sub/S) * 2**(e-1), (1 + (sub+1)/S) * 2**(e-1))``;
quantiles report its midpoint, so the relative error is at most
``1 / (2 * S * (1 + sub/S)) <= 1 / (2S)`` = 0.78% for ``S = 64``, at any scale
(this is HdrHistogram's layout without a fixed value range). Values ``<= 0`` go
to a separate zero bucket. Buckets live in a dict, so memory grows with the
number of distinct buckets used (about ``S`` per factor of two), not with the
sample count. Two histograms with the same ``S`` merge by adding counts.
Units are the caller's; the instruments record seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

DEFAULT_SUB_BUCKETS = 64


class Histogram:
    """Log-linear histogram of non-negative floats."""

    __slots__ = ("_counts", "count", "max", "min", "sub_buckets", "sum", "zero")

    def __init__(self, sub_buckets: int = DEFAULT_SUB_BUCKETS) -> None:
        if sub_buckets < 2:
            raise ValueError("sub_buckets must be >= 2")
        self.sub_buckets = sub_buckets
        self._counts: dict[int, int] = {}
        self.zero = 0
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    def record(self, value: float) -> None:
        """Add one observation."""
        self.count += 1
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        if value <= 0.0:
            self.zero += 1
            return
        m, e = math.frexp(value)
        s = self.sub_buckets
        idx = e * s + int((m + m - 1.0) * s)
        counts = self._counts
        counts[idx] = counts.get(idx, 0) + 1

    def record_many(self, values: Iterable[float]) -> None:
        """Add several observations."""
        for v in values:
            self.record(v)

    def _midpoint(self, idx: int) -> float:
        e, sub = divmod(idx, self.sub_buckets)
        return math.ldexp(1.0 + (sub + 0.5) / self.sub_buckets, e - 1)

    def quantile(self, q: float) -> float:
        """The value at quantile ``q`` in [0, 1] (nan when empty)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("q must be in [0, 1]")
        if self.count == 0:
            return math.nan
        rank = max(1, math.ceil(q * self.count))
        if rank <= self.zero:
            return min(0.0, self.min)
        seen = self.zero
        for idx in sorted(self._counts):
            seen += self._counts[idx]
            if seen >= rank:
                return min(max(self._midpoint(idx), self.min), self.max)
        return self.max

    def percentiles(self, ps: Iterable[float]) -> dict[str, float]:
        """``{"p50": v, ...}`` for percentiles ``ps`` (e.g. 50, 99.9)."""
        return {f"p{p:g}": self.quantile(p / 100.0) for p in ps}

    @property
    def mean(self) -> float:
        """Arithmetic mean (nan when empty)."""
        return self.sum / self.count if self.count else math.nan

    def merge(self, other: Histogram) -> None:
        """Add ``other``'s observations into this histogram (same ``sub_buckets``)."""
        if other.sub_buckets != self.sub_buckets:
            raise ValueError("cannot merge histograms with different sub_buckets")
        for idx, n in other._counts.items():
            self._counts[idx] = self._counts.get(idx, 0) + n
        self.zero += other.zero
        self.count += other.count
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe representation (``from_dict`` reads it back)."""
        return {
            "sub_buckets": self.sub_buckets,
            "count": self.count,
            "sum": self.sum,
            "min": self.min if self.count else None,
            "max": self.max if self.count else None,
            "zero": self.zero,
            "buckets": [[i, n] for i, n in sorted(self._counts.items())],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Histogram:
        """Rebuild a histogram from ``to_dict`` output."""
        h = cls(int(data["sub_buckets"]))
        h._counts = {int(i): int(n) for i, n in data["buckets"]}
        h.zero = int(data["zero"])
        h.count = int(data["count"])
        h.sum = float(data["sum"])
        if h.count:
            h.min = float(data["min"])
            h.max = float(data["max"])
        return h
