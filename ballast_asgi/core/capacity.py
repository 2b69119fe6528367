"""The cap on what the gateway holds in total (pure: no I/O, no clock).

Past the knee the queue and the limiter bound *how many* requests wait and run,
but a gateway configured with a large queue, a large fixed limit, or no queue
at all can still accept work faster than it finishes it and hold it in memory
until it is killed. ``Capacity`` is the backstop: one counter of requests the
gateway holds (entered and not yet finished: in flight + queued + being
answered) and one ``ByteBudget`` of request bytes it has promised to buffer.

**Held requests.** With cap ``C`` and reserve fraction ``r``::

    reserve      = floor(C * r)
    CRITICAL     admitted iff held < C
    other tiers  admitted iff held < C - reserve

so the last ``reserve`` slots are kept for the critical tier (the same idea as
the queue's ``reserved_fraction``): when the cap binds, bulk gives way first.
``enter`` increments, ``leave`` decrements; the adapter calls ``leave`` in
``finally`` exactly once per successful ``enter``.

**Bytes.** ``ByteBudget(max_bytes)`` holds ``used_bytes``. ``try_reserve(n)``
succeeds iff ``n == 0`` or ``used_bytes + n <= max_bytes``; ``release(n)``
gives ``n`` back (never below 0). The adapters reserve what they actually
buffer, chunk by chunk as it arrives (the request body stage, the retry
stage's held response), never a declared ``Content-Length``: a client that
announces a large body and sends nothing holds no budget.
"""

from __future__ import annotations

import math

from ballast_asgi.core.priority import Priority

#: Read once: an attribute of an ``Enum`` class costs ~0.1 us a read.
_CRITICAL = Priority.CRITICAL


class ByteBudget:
    """A shared budget of buffered bytes."""

    __slots__ = ("max_bytes", "peak_bytes", "used_bytes")

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.peak_bytes = 0

    def try_reserve(self, n_bytes: int) -> bool:
        """Reserve ``n_bytes`` if they fit; ``False`` (nothing reserved) otherwise."""
        if n_bytes <= 0:
            return True
        if self.used_bytes + n_bytes > self.max_bytes:
            return False
        self.used_bytes += n_bytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return True

    def release(self, n_bytes: int) -> None:
        """Give back ``n_bytes`` reserved earlier."""
        if n_bytes > 0:
            self.used_bytes = max(0, self.used_bytes - n_bytes)


class Capacity:
    """Counts held requests against ``max_held`` and owns the byte budget."""

    __slots__ = ("_limit_other", "byte_budget", "held", "max_held", "peak_held", "refused")

    def __init__(
        self, max_held: int, *, max_buffered_bytes: int, reserved_fraction: float = 0.0
    ) -> None:
        self.held = 0
        self.peak_held = 0
        self.refused = 0
        self.byte_budget = ByteBudget(max_buffered_bytes)
        self.max_held = max_held
        self._limit_other = max_held
        self.reconfigure(max_held, max_buffered_bytes, reserved_fraction)

    def reconfigure(self, max_held: int, max_buffered_bytes: int, reserved_fraction: float) -> None:
        """New bounds; requests already held stay held."""
        if max_held < 1:
            raise ValueError(f"max_held must be >= 1, got {max_held}")
        if not 0.0 <= reserved_fraction <= 1.0:
            raise ValueError(f"reserved_fraction must be in [0, 1], got {reserved_fraction}")
        if max_buffered_bytes < 0:
            raise ValueError(f"max_buffered_bytes must be >= 0, got {max_buffered_bytes}")
        self.max_held = max_held
        self._limit_other = max_held - math.floor(max_held * reserved_fraction)
        self.byte_budget.max_bytes = max_buffered_bytes

    def try_enter(self, priority: Priority, body_bytes: int = 0) -> bool:
        """Admit one request (and reserve its body bytes), or refuse it."""
        limit = self.max_held if priority is _CRITICAL else self._limit_other
        held = self.held
        if held >= limit or (body_bytes > 0 and not self.byte_budget.try_reserve(body_bytes)):
            self.refused += 1
            return False
        self.held = held = held + 1
        if held > self.peak_held:
            self.peak_held = held
        return True

    def would_refuse(self, priority: Priority) -> bool:
        """Whether ``try_enter(priority)`` would refuse now (takes and counts nothing)."""
        limit = self.max_held if priority is _CRITICAL else self._limit_other
        return self.held >= limit

    def leave(self, body_bytes: int = 0) -> None:
        """One admitted request finished; give back what it reserved."""
        self.held -= 1
        if body_bytes > 0:  # ``ByteBudget.release`` gives back nothing else
            self.byte_budget.release(body_bytes)

    def snapshot(self) -> dict[str, object]:
        """JSON-safe state for ``/snapshot``."""
        return {
            "held": self.held,
            "max_held": self.max_held,
            "max_held_non_critical": self._limit_other,
            "peak_held": self.peak_held,
            "refused": self.refused,
            "buffered_bytes": self.byte_budget.used_bytes,
            "max_buffered_bytes": self.byte_budget.max_bytes,
            "peak_buffered_bytes": self.byte_budget.peak_bytes,
        }
