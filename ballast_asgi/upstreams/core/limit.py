"""The gateway-wide limit of a pool: the sum of its instances' own limits (pure).

With per-instance limiters, each instance's adaptive limit tracks that
instance's latency, so one slow instance shrinks its own share instead of
dragging the whole gateway's limit down. The gateway-wide limiter (in front
of the gateway-wide priority queue) then enforces::

    limit = clamp(sum of the limits of the eligible instances, 1, cap)

and takes no samples itself (they go to the instances). Eligible instances
are the routable ones, or all of them in panic mode (``Pool.eligible``).
"""

from __future__ import annotations

from ballast_asgi.core.limit.base import Sample
from ballast_asgi.core.types import Clock
from ballast_asgi.upstreams.core.pool import Pool


class PoolLimit:
    """A limit algorithm that reads the pool instead of learning from samples."""

    name = "pool"

    def __init__(self, pool: Pool, clock: Clock, cap: int | None = None) -> None:
        if cap is not None and cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.pool = pool
        self.clock = clock
        self.cap = cap

    @property
    def limit(self) -> int:
        """The sum of the eligible instances' limits, capped."""
        total = self.pool.total_limit(self.clock())
        return total if self.cap is None else min(total, self.cap)

    def on_sample(self, sample: Sample, now: float) -> int:
        """Samples are the instances' business: ignored here."""
        return self.limit

    def snapshot(self) -> dict[str, object]:
        """The summed limit and how many instances make it."""
        return {"name": self.name, "limit": self.limit, "instances": len(self.pool.instances)}
