"""Vegas: queue-size estimation from the no-load RTT (after Netflix ``VegasLimit``).

Per sample (``rtt_noload`` is the smallest RTT seen since the last probe)::

    queue  = ceil(limit * (1 - rtt_noload / rtt))        # requests queued upstream
    step   = max(1, floor(log10(limit)))
    alpha  = 3 * step;  beta = 6 * step;  threshold = step

    dropped:                         limit <- limit - step
    inflight_at_start * 2 < limit:   unchanged (not binding)
    queue <= threshold:              limit <- limit + beta
    queue <  alpha:                  limit <- limit + step
    queue >  beta:                   limit <- limit - step
    otherwise:                       unchanged

    limit <- (1 - smoothing) * limit + smoothing * new, clamped to [min, max]

The no-load RTT is re-probed (forgotten, then re-learned from the next sample)
every ``probe_every`` samples, so it can rise again when the backend slows.

Defaults: initial 20, min 4, max 1000, smoothing 1.0, probe_every 1000.
"""

from __future__ import annotations

import math

from ballast_asgi.core.limit.base import (
    DEFAULT_INITIAL_LIMIT,
    DEFAULT_MAX_LIMIT,
    DEFAULT_MIN_LIMIT,
    Sample,
    check_bounds,
    clamp,
    log10_root,
)


class VegasLimit:
    """Delay-based limit estimating the upstream queue from the RTT ratio."""

    name = "vegas"

    def __init__(
        self,
        *,
        initial_limit: int = DEFAULT_INITIAL_LIMIT,
        min_limit: int = DEFAULT_MIN_LIMIT,
        max_limit: int = DEFAULT_MAX_LIMIT,
        smoothing: float = 1.0,
        probe_every: int = 1000,
    ) -> None:
        check_bounds(initial_limit, min_limit, max_limit)
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        self._limit = float(initial_limit)
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.smoothing = smoothing
        self.probe_every = probe_every
        self._rtt_noload_s: float | None = None
        self._since_probe = 0

    @property
    def limit(self) -> int:
        """The current limit."""
        return int(self._limit)

    def on_sample(self, sample: Sample, now: float) -> int:
        """Move the limit by the estimated queue size."""
        self._since_probe += 1
        if self._since_probe >= self.probe_every:
            self._since_probe = 0
            self._rtt_noload_s = None
        rtt = sample.backend_rtt_s
        if not sample.dropped and (self._rtt_noload_s is None or rtt < self._rtt_noload_s):
            self._rtt_noload_s = rtt
            return self.limit
        new = self._target(sample, rtt)
        if new is None:
            return self.limit
        blended = (1.0 - self.smoothing) * self._limit + self.smoothing * new
        self._limit = clamp(blended, self.min_limit, self.max_limit)
        return self.limit

    def _target(self, sample: Sample, rtt: float) -> float | None:
        limit = self._limit
        step = log10_root(limit)
        if sample.dropped:
            return limit - step
        if sample.inflight_at_start * 2 < limit or self._rtt_noload_s is None:
            return None
        queue = math.ceil(limit * (1.0 - self._rtt_noload_s / rtt))
        if queue <= step:
            return limit + 6 * step
        if queue < 3 * step:
            return limit + step
        if queue > 6 * step:
            return limit - step
        return None

    def snapshot(self) -> dict[str, object]:
        """The limit and the no-load RTT."""
        return {"name": self.name, "limit": self.limit, "rtt_noload_s": self._rtt_noload_s}
