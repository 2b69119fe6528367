"""The concurrency limiter (pure): ``Limiter``, the one everyone builds.

Every permit, sample and partition is ``LimiterCore`` (``limiter_core.py``, compiled
with the request's path, ADR 0021); ``Limiter`` is that class made weak-referenceable,
which a compiled class is not safely (its deallocation does not clear weak references),
and a class written in Python is. So the process can list its limiters:
``live_limiters()``, with which a test fixture asserts that none is left with permits
in flight. Every name of ``limiter_core.py`` is importable from here.
"""

from __future__ import annotations

import weakref

from ballast_asgi.core.limiter_core import (
    DEFAULT_PARTITION_IDLE_S,
    DEFAULT_QUIET_LIMIT,
    QUIET_AFTER_S,
    SHARED,
    LimiterCore,
    Permit,
)

_LIVE: weakref.WeakSet[Limiter] = weakref.WeakSet()


def live_limiters() -> list[Limiter]:
    """Every limiter still alive in this process."""
    return list(_LIVE)


class Limiter(LimiterCore):
    """Hands out permits against a limit algorithm's current limit (``LimiterCore``)."""

    def _track(self) -> None:
        _LIVE.add(self)


__all__ = [
    "DEFAULT_PARTITION_IDLE_S",
    "DEFAULT_QUIET_LIMIT",
    "QUIET_AFTER_S",
    "SHARED",
    "Limiter",
    "LimiterCore",
    "Permit",
    "live_limiters",
]
