"""AIMD: additive increase, multiplicative decrease (after Netflix ``AIMDLimit``).

Per sample::

    dropped (or rtt_s > timeout_s):   limit <- limit * backoff_ratio
    elif inflight_at_start * 2 >= limit:   limit <- limit + 1
    else:                              unchanged (the limit is not binding)

then clamped to ``[min_limit, max_limit]``.

Defaults: initial 20, min 4, max 1000, backoff_ratio 0.9, timeout_s 5.0.
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


class AIMDLimit:
    """Loss-based additive-increase / multiplicative-decrease limit."""

    name = "aimd"

    def __init__(
        self,
        *,
        initial_limit: int = DEFAULT_INITIAL_LIMIT,
        min_limit: int = DEFAULT_MIN_LIMIT,
        max_limit: int = DEFAULT_MAX_LIMIT,
        backoff_ratio: float = 0.9,
        timeout_s: float = 5.0,
    ) -> None:
        check_bounds(initial_limit, min_limit, max_limit)
        if not 0.5 <= backoff_ratio < 1.0:
            raise ValueError(f"backoff_ratio must be in [0.5, 1.0), got {backoff_ratio}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._limit = float(initial_limit)
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.backoff_ratio = backoff_ratio
        self.timeout_s = timeout_s

    @property
    def limit(self) -> int:
        """The current limit."""
        return int(self._limit)

    def on_sample(self, sample: Sample, now: float) -> int:
        """Back off on a drop, add one when binding."""
        if sample.dropped or sample.rtt_s > self.timeout_s:
            new = self._limit * self.backoff_ratio
        elif sample.inflight_at_start * 2 >= self._limit:
            new = self._limit + 1.0
        else:
            return self.limit
        self._limit = clamp(new, self.min_limit, self.max_limit)
        return self.limit

    def snapshot(self) -> dict[str, object]:
        """Parameters and the limit."""
        return {"name": self.name, "limit": self.limit, "backoff_ratio": self.backoff_ratio}
