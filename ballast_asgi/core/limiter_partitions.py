"""A limiter partitioned by route (ADR 0016): each route its own limit (pure).

With ``partition`` (a factory of limit algorithms) the limiter admits a request
when its route's own algorithm has room (and total in-flight is below
``max_limit``), and each sample goes to its route's algorithm only, so a slow
or saturated endpoint never spends another endpoint's permits. At most
``max_partitions`` routes get their own; later ones share ``~other``
(``OTHER_ROUTE``). With ``own_routes`` only those routes get their own, the
rest share one (``SHARED``). ``limit`` is then the sum of the partitions'
limits. ``partition(quiet)`` builds a route's algorithm: ``quiet`` is True
when the gateway has been answering for ``QUIET_AFTER_S`` and no route is at
its limit (a new or long-idle route then starts at the quiet limit, not at the
cold-start one); a partition idle (nothing in flight, no sample) for
``partition_idle_s`` starts over, so an idle route's stale limit is not kept.

``RoutePartitioning`` is the part of ``Limiter`` (``limiter.py``) that finds
and makes a route's ``Partition``; its state lives on the limiter, so the
admission path calls these methods directly, with no layer in between.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ballast_asgi.core.limit.base import LimitAlgorithm, result_feed
from ballast_asgi.core.limit.route_floors import OTHER_ROUTE
from ballast_asgi.core.native import mypyc_attr

#: The partition of the routes without one of their own (``Limiter.own_routes``).
SHARED = ""
#: A partitioned limiter counts as quiet only after answering this long.
QUIET_AFTER_S = 1.0
#: The initial limit of a route's partition built while the gateway is quiet.
DEFAULT_QUIET_LIMIT = 64
#: Default seconds after which an idle partition starts over.
DEFAULT_PARTITION_IDLE_S = 10.0


class Partition:
    """One route's algorithm, in-flight count and last use."""

    __slots__ = ("algorithm", "feed", "inflight", "used")

    def __init__(self, algorithm: LimitAlgorithm, now: float) -> None:
        self.algorithm = algorithm
        #: ``algorithm``'s ``on_result`` when it has one (``result_feed``): no ``Sample``.
        self.feed = result_feed(algorithm)
        self.inflight = 0
        self.used = now


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled; ``Limiter`` subclasses it in Python
class RoutePartitioning:
    """Finding, making and evicting a limiter's route partitions (mixed into ``Limiter``)."""

    max_partitions: int
    partition_idle_s: float
    #: Partitioned: None gives every route its own limit; a set gives one only to
    #: these routes (``routes[].limiter.partition``), the others share ``SHARED``.
    own_routes: frozenset[str] | None
    _partition: Callable[[bool], LimitAlgorithm] | None
    _parts: dict[str, Partition]
    _first_sample_at: float | None

    @property
    def partitioned(self) -> bool:
        """True when every route has its own limit (ADR 0016)."""
        return self._partition is not None

    def _key(self, route: str) -> str:
        """The partition key of ``route`` (``SHARED`` when it has no partition of its own)."""
        own = self.own_routes
        return route if own is None or route in own else SHARED

    def _part_full(self, now: float, route: str) -> bool | None:
        """Whether ``route``'s partition is at its limit, as ``_part`` would find it at
        ``now`` (creates nothing); None when the table is full (eviction would decide)."""
        key = self._key(route)
        part = self._parts.get(key)
        if part is not None and part.inflight == 0 and now - part.used >= self.partition_idle_s:
            part = None  # stale: ``_part`` would start a fresh one
        if part is None:
            if len(self._parts) >= self.max_partitions - 1 and key != OTHER_ROUTE:
                return None
            return False  # a fresh partition has nothing in flight
        return part.inflight >= part.algorithm.limit

    def _part(self, route: str, now: float | None = None) -> Partition:
        """``route``'s partition: made on first use (or after idling), ``~other`` once full."""
        route = self._key(route)
        part = self._parts.get(route)
        idle = part is not None and now is not None and now - part.used >= self.partition_idle_s
        if part is not None and idle and part.inflight == 0:  # idle: its limit is stale
            del self._parts[route]
            part = None
        if part is None:
            if len(self._parts) >= self.max_partitions - 1 and now is not None:
                self._evict_idle(now)
            if len(self._parts) >= self.max_partitions - 1 and route != OTHER_ROUTE:
                return self._part(OTHER_ROUTE, now)
            assert self._partition is not None
            fresh = now if now is not None else -math.inf
            part = self._parts[route] = Partition(self._partition(self._quiet(now)), fresh)
        return part

    def _evict_idle(self, now: float) -> None:
        """Make room: drop partitions with nothing in flight, unused for ``partition_idle_s``."""
        idle = [key for key, p in self._parts.items()
                if p.inflight == 0 and now - p.used >= self.partition_idle_s]  # fmt: skip
        for key in idle:
            del self._parts[key]

    def _quiet(self, now: float | None) -> bool:
        """Answering for a while and no route at its limit: a new route may start high."""
        first = self._first_sample_at
        if now is None or first is None or now - first < QUIET_AFTER_S:
            return False
        return all(p.inflight < p.algorithm.limit for p in self._parts.values())
