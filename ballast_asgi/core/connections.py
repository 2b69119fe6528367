"""A cap on long-lived connections (websockets) with a share reserved for the critical tier.

Pure and synchronous: ``try_acquire(priority)`` either takes a slot or says
no; ``release()`` gives one back (exactly once per successful acquire, by the
caller's ``finally``). With ``max_connections = N`` and
``reserved_fraction = r``, the standard and bulk tiers may hold at most
``N - ceil(N * r)`` slots; the critical tier may use all ``N``. Long-lived
connections are counted here and never by the concurrency limiter, whose RTT
samples they would distort.

``max_per_client`` (None: no per-client cap) bounds the slots one client key
holds, whatever its tier, so one address cannot take every shared slot. The
key is the caller's (the originating client address); ``None`` is a key too
(every client without an address shares it). Counts of keys that reach zero
are dropped, so the table holds only keys with open connections.
"""

from __future__ import annotations

import math

from ballast_asgi.core.priority import Priority

__all__ = ["ConnectionCap"]


class ConnectionCap:
    """Counts open connections against ``max_connections``."""

    def __init__(
        self,
        max_connections: int,
        reserved_fraction: float = 0.0,
        max_per_client: int | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if not 0.0 <= reserved_fraction <= 1.0:
            raise ValueError(f"reserved_fraction must be in [0, 1], got {reserved_fraction}")
        if max_per_client is not None and max_per_client < 1:
            raise ValueError(f"max_per_client must be >= 1, got {max_per_client}")
        self.max_connections = max_connections
        self.shared = max_connections - math.ceil(max_connections * reserved_fraction)
        self.max_per_client = max_per_client
        self.open = 0
        self.by_client: dict[str | None, int] = {}

    def client_full(self, client: str | None) -> bool:
        """Whether ``client`` already holds ``max_per_client`` slots."""
        cap = self.max_per_client
        return cap is not None and self.by_client.get(client, 0) >= cap

    def try_acquire(self, priority: Priority, client: str | None = None) -> bool:
        """Take a slot when the tier and the client may; False when either is full."""
        ceiling = self.max_connections if priority is Priority.CRITICAL else self.shared
        if self.open >= ceiling or self.client_full(client):
            return False
        self.open += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        return True

    def release(self, client: str | None = None) -> None:
        """Give back a slot taken for ``client``."""
        held = self.by_client.get(client, 0)
        if self.open <= 0 or held <= 0:
            raise RuntimeError("ConnectionCap.release() without a matching acquire")
        self.open -= 1
        if held == 1:
            del self.by_client[client]
        else:
            self.by_client[client] = held - 1

    def snapshot(self) -> dict[str, int | None]:
        """Open connections, the two ceilings, the per-client cap and the busiest client's count."""
        return {
            "open": self.open,
            "max": self.max_connections,
            "shared_max": self.shared,
            "max_per_client": self.max_per_client,
            "clients": len(self.by_client),
            "busiest_client": max(self.by_client.values(), default=0),
        }
