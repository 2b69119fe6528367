"""A cap on long-lived connections (websockets) with a share reserved for the critical tier.

Pure and synchronous: ``try_acquire(priority)`` either takes a slot or says
no; ``release()`` gives one back (exactly once per successful acquire, by the
caller's ``finally``). With ``max_connections = N`` and
``reserved_fraction = r``, the standard and bulk tiers may hold at most
``N - ceil(N * r)`` slots; the critical tier may use all ``N``. Long-lived
connections are counted here and never by the concurrency limiter, whose RTT
samples they would distort.
"""

from __future__ import annotations

import math

from ballast_asgi.core.priority import Priority

__all__ = ["ConnectionCap"]


class ConnectionCap:
    """Counts open connections against ``max_connections``."""

    def __init__(self, max_connections: int, reserved_fraction: float = 0.0) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if not 0.0 <= reserved_fraction <= 1.0:
            raise ValueError(f"reserved_fraction must be in [0, 1], got {reserved_fraction}")
        self.max_connections = max_connections
        self.shared = max_connections - math.ceil(max_connections * reserved_fraction)
        self.open = 0

    def try_acquire(self, priority: Priority) -> bool:
        """Take a slot when the tier may; False when it is full for this tier."""
        ceiling = self.max_connections if priority is Priority.CRITICAL else self.shared
        if self.open >= ceiling:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        """Give a slot back."""
        if self.open <= 0:
            raise RuntimeError("ConnectionCap.release() without a matching acquire")
        self.open -= 1

    def snapshot(self) -> dict[str, int]:
        """Open connections and the two ceilings."""
        return {"open": self.open, "max": self.max_connections, "shared_max": self.shared}
