"""Enforcement of a concurrency limit: permits, never blocking (pure, compiled).

``Limiter.try_acquire(now)`` compares in-flight with the algorithm's limit and
increments in the same synchronous step (no ``await`` in between, so admission
is atomic on one event loop). Every ``Permit`` is released exactly once with
an ``Outcome``:

* ``SUCCESS``: the round trip is an RTT sample;
* ``DROPPED``: timeout / 5xx / deadline miss, a congestion sample;
* ``IGNORED``: client gone or shed downstream, no sample.

A second ``release`` of the same permit is a **no-op that is counted** in
``Limiter.double_releases`` (and shown in the snapshot): raising from a
``finally`` block would mask the request's real error, and the count still
makes the bug visible. After each release the limiter calls the ``on_release``
callback (the queue uses it to hand freed slots to waiters); a release made
from inside that callback does not re-enter it.

The limiter also keeps what the other stages need to estimate waits: recent
completions per second (``throughput_rps``), an exponentially weighted recent
RTT and a windowed minimum RTT (``rtt_min_s``, the "minimum service time" of
early drop). With a ``loop_lag`` source (a callable returning seconds, the
gateway's own event-loop lag, ``ballast_asgi.core.loop_lag``) every sample
carries the lag measured when it was taken, so delay-based algorithms can
tell the gateway's own lateness from backend queueing (ADR 0010); the
limiter's own ``rtt_recent_s``/``rtt_min_s`` stay the raw round trip.
With ``partition`` (a factory of limit algorithms; ADR 0016) the limiter is
**partitioned by route**: ``try_acquire(now, route)`` admits a request when
its route's own algorithm has room (and total in-flight is below
``max_limit``), each sample goes to its route's algorithm only, and ``limit``
is the sum of the partitions' limits; ``limiter_partitions.py`` says which
routes get their own, when a new one starts at the quiet limit and when an
idle one starts over. ``Permit`` is ``limiter_permit.py``, the throughput and
minimum-RTT windows ``limiter_windows.py`` (every name importable from here).
A sample goes to the algorithm's ``on_result`` (its fields as arguments) when
the algorithm has one whose ``on_sample`` only unpacks the ``Sample``
(``limit.base.result_feed``: the gradient), else as a ``Sample`` to ``on_sample``.
``LimiterCore`` is all of it; ``Limiter`` (``limiter.py``) is the same class made
weak-referenceable, so the process can list its limiters: it is what everyone builds.

Longer than 320 lines because a request's acquire and its release are one
frame each (issue 31): the partition lookup, the windows' update, the sample
and the on-release callback are written out where helpers would cost a call
per request; the partition table itself is ``limiter_partitions.py``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from ballast_asgi.core.limit.base import LimitAlgorithm, ResultFeed, Sample, result_feed
from ballast_asgi.core.limit.route_floors import DEFAULT_MAX_ROUTES, OTHER_ROUTE
from ballast_asgi.core.limiter_partitions import (
    DEFAULT_PARTITION_IDLE_S,
    DEFAULT_QUIET_LIMIT,
    QUIET_AFTER_S,
    SHARED,
    Partition,
    RoutePartitioning,
)
from ballast_asgi.core.limiter_permit import Permit
from ballast_asgi.core.limiter_windows import RateWindow, WindowedMin
from ballast_asgi.core.native import mypyc_attr
from ballast_asgi.core.outcome import Outcome

#: Enum members read once: an attribute of an ``Enum`` class costs ~0.1 us a read.
_IGNORED = Outcome.IGNORED
_DROPPED = Outcome.DROPPED
_SERIAL = itertools.count(1)


@mypyc_attr(allow_interpreted_subclasses=True)  # ``Limiter`` (``limiter.py``) is one
class LimiterCore(RoutePartitioning):
    """Hands out permits against a limit algorithm's current limit."""

    def __init__(
        self,
        algorithm: LimitAlgorithm,
        *,
        max_limit: int | None = None,
        throughput_window_s: float = 2.0,
        rtt_min_window_s: float = 10.0,
        rtt_ewma_alpha: float = 0.1,
        loop_lag: Callable[[], float] | None = None,
        partition: Callable[[bool], LimitAlgorithm] | None = None,
        max_partitions: int = DEFAULT_MAX_ROUTES,
        partition_idle_s: float = DEFAULT_PARTITION_IDLE_S,
        own_routes: frozenset[str] | None = None,
    ) -> None:
        if max_partitions < 1:
            raise ValueError(f"max_partitions must be >= 1, got {max_partitions}")
        if max_limit is not None and max_limit < 1:
            raise ValueError(f"max_limit must be >= 1, got {max_limit}")
        if throughput_window_s <= 0 or rtt_min_window_s <= 0:
            raise ValueError("throughput_window_s and rtt_min_window_s must be > 0")
        if not 0.0 < rtt_ewma_alpha <= 1.0:
            raise ValueError(f"rtt_ewma_alpha must be in (0, 1], got {rtt_ewma_alpha}")
        self.algorithm = algorithm
        self.max_limit = max_limit
        self.serial = next(_SERIAL)
        self.double_releases = 0
        self.acquired = 0
        self.rejected = 0
        self._inflight = 0
        self._on_release: Callable[[float], None] | None = None
        self._notifying = False
        self._completions = RateWindow(throughput_window_s)
        self._rtt_min = WindowedMin(rtt_min_window_s)
        self._alpha = rtt_ewma_alpha
        self._rtt_recent_s: float | None = None
        #: Seconds of the gateway's own event-loop lag right now (None: not measured).
        self.loop_lag = loop_lag
        self._partition = partition
        self.max_partitions = max_partitions
        self._parts: dict[str, Partition] = {}
        self.partition_idle_s = partition_idle_s
        #: Partitioned: None gives every route its own limit; a set gives one only to
        #: these routes (``routes[].limiter.partition``), the others share ``SHARED``.
        self.own_routes = own_routes
        self._first_sample_at: float | None = None
        #: ``result_feed(algorithm)`` and the algorithm it was resolved for.
        self._fed: LimitAlgorithm | None = None
        self._feed: ResultFeed | None = None
        self._track()

    def _track(self) -> None:
        """``Limiter`` (``limiter.py``) lists itself among the process's limiters."""

    # -- state ----------------------------------------------------------------
    @property
    def limit(self) -> int:
        """The enforced limit: the algorithm's (partitioned: the sum), capped by ``max_limit``."""
        if self._partition is not None:
            limit = sum(p.algorithm.limit for p in self._parts.values()) or self.algorithm.limit
        else:
            limit = self.algorithm.limit
        return limit if self.max_limit is None else min(limit, self.max_limit)

    @property
    def inflight(self) -> int:
        """Permits currently held."""
        return self._inflight

    @property
    def rtt_recent_s(self) -> float | None:
        """Exponentially weighted recent RTT of successful requests."""
        return self._rtt_recent_s

    @property
    def rtt_min_s(self) -> float | None:
        """Minimum successful RTT over the last ``rtt_min_window_s``."""
        return self._rtt_min.value()

    def has_capacity(self, route: str = "") -> bool:
        """True when ``try_acquire`` would succeed now (for ``route``, when partitioned)."""
        if self._partition is None:
            return self._inflight < self.limit
        if self.max_limit is not None and self._inflight >= self.max_limit:
            return False
        own = self.own_routes
        part = self._parts.get(route if own is None or route in own else SHARED)
        if part is None:
            part = self._part(route)  # a route never seen starts at its initial limit
        return part.inflight < part.algorithm.limit

    def throughput_rps(self, now: float) -> float:
        """Completions (success or dropped) per second, recently."""
        return self._completions.rate(now)

    # -- permits --------------------------------------------------------------
    def full(self, now: float, route: str = "") -> bool | None:
        """Whether ``try_acquire(now, route)`` would refuse (takes and creates nothing);
        None when it cannot tell without changing the partition table (it is full)."""
        if self._partition is None:
            return self._inflight >= self.limit
        if self.max_limit is not None and self._inflight >= self.max_limit:
            return True
        own = self.own_routes
        part = self._parts.get(route if own is None or route in own else SHARED)
        if part is not None and (part.inflight or not now - part.used >= self.partition_idle_s):
            return part.inflight >= part.algorithm.limit
        return self._part_full(now, route)  # none yet, or stale: ``_part`` would make one

    def try_acquire(self, now: float, route: str = "") -> Permit | None:
        """A permit if in-flight is below the limit, else None. Never blocks.

        ``route`` is the request's route key: partitioned, its own limit decides.
        """
        if self._partition is None:
            limit = self.limit
            if self._inflight >= limit:
                self.rejected += 1
                return None
            self._inflight += 1
            self.acquired += 1
            return Permit(self, now, self._inflight, limit, route)
        own = self.own_routes
        key = route if own is None or route in own else SHARED
        part = self._parts.get(key)
        if part is None or (not part.inflight and now - part.used >= self.partition_idle_s):
            # None yet, or idle (its limit is stale), or the table is full: ``_part`` decides.
            part = self._part(route, now)
            if self._parts.get(key) is not part:
                route = OTHER_ROUTE
        limit = part.algorithm.limit
        if (self.max_limit is not None and self._inflight >= self.max_limit) or (
            part.inflight >= limit
        ):
            self.rejected += 1
            return None
        part.inflight += 1
        part.used = now
        self._inflight += 1
        self.acquired += 1
        return Permit(self, now, part.inflight, limit, route, part)

    def set_algorithm(
        self,
        algorithm: LimitAlgorithm,
        *,
        max_limit: int | None = None,
        now: float | None = None,
        partition: Callable[[bool], LimitAlgorithm] | None = None,
        own_routes: frozenset[str] | None = None,
    ) -> None:
        """Swap the algorithm (config reload) keeping permits in flight.

        With ``now`` the on-release callback runs at once, so a higher limit
        reaches queued waiters immediately; otherwise at the next release.
        The route partitions start over (``partition``; None: one limit).
        """
        if max_limit is not None and max_limit < 1:
            raise ValueError(f"max_limit must be >= 1, got {max_limit}")
        self._partition = partition
        self.own_routes = own_routes
        self._parts = {}
        self.algorithm = algorithm
        self.max_limit = max_limit
        if now is not None:
            self._notify(now)

    def set_on_release(self, callback: Callable[[float], None] | None) -> None:
        """Call ``callback(now)`` after every release (one callback; None clears it)."""
        self._on_release = callback

    def _release(self, permit: Permit, outcome: Outcome, now: float, rtt: float | None) -> None:
        """Give ``permit`` back: its sample (unless IGNORED), then the on-release callback.

        One method for the whole release (it is every request's): the sample goes
        to the algorithm's ``on_result`` when it has one (``result_feed``), so no
        ``Sample`` is built; otherwise ``on_sample(Sample(...))``.
        """
        self._inflight -= 1
        part = permit.part
        if part is not None:
            part.inflight -= 1
        if outcome is not _IGNORED:
            dropped = outcome is _DROPPED
            rtt_s = now - permit.start if rtt is None else rtt
            if not rtt_s > 0.0:  # ``max(0.0, rtt_s)``
                rtt_s = 0.0
            self._completions.add(now)
            if not dropped:
                self._rtt_min.add(rtt_s, now)
                prev = self._rtt_recent_s
                self._rtt_recent_s = rtt_s if prev is None else prev + self._alpha * (rtt_s - prev)
            lag = self.loop_lag() if self.loop_lag is not None else 0.0
            if self._first_sample_at is None:
                self._first_sample_at = now
            if part is not None:
                part.used = now
                algorithm = part.algorithm
                feed = part.feed
            else:
                algorithm = self.algorithm
                if algorithm is not self._fed:
                    self._fed, self._feed = algorithm, result_feed(algorithm)
                feed = self._feed
            if feed is not None:
                feed(permit.start, rtt_s, permit.inflight_at_start, dropped,
                     permit.limit_at_start, lag, permit.route, now)  # fmt: skip
            else:
                sample = Sample(permit.start, rtt_s, permit.inflight_at_start, dropped,
                                permit.limit_at_start, lag, permit.route)  # fmt: skip
                algorithm.on_sample(sample, now)
        callback = self._on_release  # ``_notify``
        if callback is not None and not self._notifying:
            self._notifying = True
            try:
                callback(now)
            finally:
                self._notifying = False

    def _notify(self, now: float) -> None:
        callback = self._on_release
        if callback is None or self._notifying:
            return
        self._notifying = True
        try:
            callback(now)
        finally:
            self._notifying = False

    # -- observability --------------------------------------------------------
    def snapshot(self, now: float | None = None) -> dict[str, object]:
        """JSON-safe state for ``/snapshot``."""
        snap: dict[str, object] = {
            "algorithm": self.algorithm.name,
            "limit": self.limit,
            "inflight": self._inflight,
            "rtt_recent_s": _finite(self._rtt_recent_s),
            "rtt_min_s": _finite(self.rtt_min_s),
            "max_limit": self.max_limit,
            "acquired": self.acquired,
            "rejected": self.rejected,
            "double_releases": self.double_releases,
            "loop_lag_s": self.loop_lag() if self.loop_lag is not None else None,
            "algorithm_state": self.algorithm.snapshot(),
        }
        if self._partition is not None:
            snap["partitions"] = {
                route: {"limit": p.algorithm.limit, "inflight": p.inflight,
                        "algorithm_state": p.algorithm.snapshot()}
                for route, p in sorted(self._parts.items())
            }  # fmt: skip
        if now is not None:
            snap["throughput_rps"] = self.throughput_rps(now)
        return snap


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


__all__ = [
    "DEFAULT_PARTITION_IDLE_S",
    "DEFAULT_QUIET_LIMIT",
    "QUIET_AFTER_S",
    "SHARED",
    "LimiterCore",
    "Permit",
]
