"""Gradient2: short vs long RTT averages (after Netflix ``Gradient2Limit``).

Per successful sample, with ``short`` the latest RTT and ``long`` an
exponential average over ``long_window`` samples::

    inflight_at_start < limit / 2:   unchanged (application limited);
                                     long decays towards short if long > 2 * short
    long <- long + (rtt - long) / long_window      (plain mean for the first 10)
    if long / short > 2:  long <- long * 0.95      (recover after a latency spike)
    gradient = clamp(tolerance * long / short, 0.5, 1.0)
    new      = limit * gradient + queue_size
    limit   <- (1 - smoothing) * limit + smoothing * new, clamped to [min, max]

A dropped sample (which Netflix ignores) is treated here as congestion:
``limit <- limit * backoff_ratio``, so the contract "no growth on drops" holds.
``queue_size`` defaults to 4 (Netflix's default headroom).

Defaults: initial 20, min 4, max 1000, smoothing 0.2, tolerance 1.5,
long_window 600 samples, queue_size 4, backoff_ratio 0.9.
"""

from __future__ import annotations

from ballast_asgi.core.limit.base import (
    DEFAULT_INITIAL_LIMIT,
    DEFAULT_MAX_LIMIT,
    DEFAULT_MIN_LIMIT,
    Sample,
    check_bounds,
    clamp,
)

_WARMUP = 10


class Gradient2Limit:
    """Limit scaled by the ratio of long-term to short-term RTT."""

    name = "gradient2"

    def __init__(
        self,
        *,
        initial_limit: int = DEFAULT_INITIAL_LIMIT,
        min_limit: int = DEFAULT_MIN_LIMIT,
        max_limit: int = DEFAULT_MAX_LIMIT,
        smoothing: float = 0.2,
        tolerance: float = 1.5,
        long_window: int = 600,
        queue_size: float = 4.0,
        backoff_ratio: float = 0.9,
    ) -> None:
        check_bounds(initial_limit, min_limit, max_limit)
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if tolerance < 1.0:
            raise ValueError(f"tolerance must be >= 1.0, got {tolerance}")
        if long_window < 1:
            raise ValueError(f"long_window must be >= 1, got {long_window}")
        self._limit = float(initial_limit)
        self.min_limit, self.max_limit = min_limit, max_limit
        self.smoothing, self.tolerance = smoothing, tolerance
        self.long_window, self.queue_size = long_window, queue_size
        self.backoff_ratio = backoff_ratio
        self._long_s = 0.0
        self._count = 0
        self._short_s = 0.0

    @property
    def limit(self) -> int:
        """The current limit."""
        return int(self._limit)

    def on_sample(self, sample: Sample, now: float) -> int:
        """Scale the limit by long/short RTT."""
        if sample.dropped:
            self._limit = clamp(self._limit * self.backoff_ratio, self.min_limit, self.max_limit)
            return self.limit
        short = sample.backend_rtt_s
        self._short_s = short
        if sample.inflight_at_start < self._limit / 2:
            self._recover(short)
            return self.limit
        self._add_long(short)
        self._recover(short)
        gradient = clamp(self.tolerance * self._long_s / short, 0.5, 1.0)
        new = self._limit * gradient + self.queue_size
        blended = (1.0 - self.smoothing) * self._limit + self.smoothing * new
        self._limit = clamp(blended, self.min_limit, self.max_limit)
        return self.limit

    def _add_long(self, rtt: float) -> None:
        self._count += 1
        if self._count <= _WARMUP:
            self._long_s += (rtt - self._long_s) / self._count
        else:
            self._long_s += (rtt - self._long_s) / self.long_window

    def _recover(self, short: float) -> None:
        if self._long_s > 2.0 * short:
            self._long_s *= 0.95

    def snapshot(self) -> dict[str, object]:
        """The limit and both RTT averages."""
        return {
            "name": self.name,
            "limit": self.limit,
            "rtt_long_s": self._long_s,
            "rtt_short_s": self._short_s,
        }
