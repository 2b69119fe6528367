"""A ``Permit``: one unit of a limiter's concurrency, released exactly once (pure).

``Limiter.try_acquire`` hands it out with the time, the in-flight count and the
limit in force at the start; ``release(outcome, now, rtt_s)`` gives it back
and turns it into a sample (``LimiterCore._release``). A second release is a
no-op counted in ``Limiter.double_releases``: raising from a ``finally`` block
would mask the request's real error. The limiter is ``limiter.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ballast_asgi.core.outcome import Outcome

if TYPE_CHECKING:
    from ballast_asgi.core.limiter_core import LimiterCore
    from ballast_asgi.core.limiter_partitions import Partition


class Permit:
    """One unit of concurrency; release it exactly once."""

    __slots__ = (
        "_limiter",
        "inflight_at_start",
        "limit_at_start",
        "part",
        "released",
        "route",
        "start",
    )

    def __init__(
        self,
        limiter: LimiterCore,
        start: float,
        inflight_at_start: int,
        limit_at_start: int = 0,
        route: str = "",
        part: Partition | None = None,
    ) -> None:
        self._limiter = limiter
        self.start = start
        self.inflight_at_start = inflight_at_start
        #: The limit in force when the permit was granted (0: unknown).
        self.limit_at_start = limit_at_start
        self.released = False
        #: The request's route key (ADR 0016).
        self.route = route
        #: The route's partition when the limiter is partitioned.
        self.part = part

    def release(self, outcome: Outcome, now: float, rtt_s: float | None = None) -> None:
        """Return the permit; a second call is counted and otherwise ignored.

        ``rtt_s`` is the round trip to sample (the time to the response head of a
        streamed response); without it, ``now - start``.
        """
        if self.released:
            self._limiter.double_releases += 1
            return
        self.released = True
        self._limiter._release(self, outcome, now, rtt_s)
