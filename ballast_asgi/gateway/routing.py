"""Routes in the composed stack: the table from the config, per-route breakers, state, metrics.

The pure matching is ``core/routes.py``; the config models ``config/routes.py``.
Here the configured routes become ``Route`` values with their policy resolved
once (the gateway's breaker and retry sections merged with each route's
overrides), the breaker set gets a factory per route with its own breaker
settings, and the per-route state is read for ``/snapshot`` (``routes``, keyed
by name) and ``/metrics`` (``ballast_route_requests_total`` and
``ballast_route_breaker_state`` with a ``route`` label bounded by the table's
capacity).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ballast_asgi.core.breaker import Breaker, BreakerState
from ballast_asgi.core.breaker_set import BreakerSet
from ballast_asgi.core.routes import Route, RouteRateLimit, RouteTable

if TYPE_CHECKING:
    from ballast_asgi.config import GatewayConfig
    from ballast_asgi.config.routes import RouteConfig


def make_route(rc: RouteConfig, config: GatewayConfig) -> Route:
    """One configured route with its policy resolved against the gateway's sections."""
    rl = rc.rate_limit
    return Route(
        rc.name,
        source="config",
        priority=rc.priority,
        deadline_ms=rc.deadline_ms,
        limiter_partition=rc.limiter.partition,
        breaker=rc.breaker_config(config.breaker),
        retry=rc.retry_config(config.retry),
        rate_limit=None if rl is None else RouteRateLimit(rl.rate_per_s, rl.burst),
        paths=rc.path,
        methods=rc.methods,
    )


def build_routes(config: GatewayConfig) -> RouteTable:
    """The route table of ``config`` (configured routes, then automatic groups)."""
    auto = config.auto_routes
    return RouteTable(
        (make_route(rc, config) for rc in config.routes),
        auto=auto.enabled,
        max_groups=auto.max_groups,
        learn=auto.learn,
    )


def build_breakers(
    config: GatewayConfig, routes: RouteTable, consecutive_scale: int = 1
) -> BreakerSet:
    """One breaker per route (``breaker.scope: route``) or one for all (``global``).

    ``consecutive_scale`` multiplies ``consecutive_failures`` (a pool of N instances).
    """

    def factory_of(bc: Any) -> Callable[[], Breaker]:
        if consecutive_scale > 1:
            scaled = min(100_000, bc.consecutive_failures * consecutive_scale)
            bc = bc.model_copy(update={"consecutive_failures": scaled})
        return lambda: Breaker.from_config(bc)

    if config.breaker.scope == "global":
        return BreakerSet(factory_of(config.breaker), max_keys=0)
    own = {r.name: factory_of(r.breaker) for r in routes.configured if r.breaker is not None}
    return BreakerSet(factory_of(config.breaker), max_keys=routes.capacity, factories=own)


def routes_snapshot(routes: RouteTable, breakers: BreakerSet, now: float) -> dict[str, Any]:
    """``/snapshot``'s ``routes``: every known route by name, with its breaker and count."""
    out: dict[str, Any] = {}
    for name, route in sorted(routes.known().items()):
        entry = route.describe()
        entry["requests"] = routes.counts.get(name, 0)
        breaker = breakers.get(name) if name in routes.counts else None
        entry["breaker"] = None if breaker is None else _breaker_state(breaker, now)
        out[name] = entry
    return out


def _breaker_state(breaker: Breaker, now: float) -> dict[str, Any]:
    snap = breaker.snapshot(now)
    keep = (
        "state", "open_remaining_s", "trips_in_a_row", "window_calls", "window_failures",
        "window_shared_failures", "failing_clients", "min_failing_clients", "transitions",
    )  # fmt: skip
    return {k: snap[k] for k in keep if k in snap}


class RouteCollector(Collector):
    """Per-route requests and breaker state at scrape time (labels bounded by the table)."""

    def __init__(
        self, parts: Callable[[], tuple[RouteTable, BreakerSet]], clock: Callable[[], float]
    ) -> None:
        self._parts = parts
        self._clock = clock

    def collect(self) -> Iterator[Any]:
        """Yield ``ballast_route_requests_total`` and ``ballast_route_breaker_state``."""
        routes, breakers = self._parts()
        now = self._clock()
        requests = CounterMetricFamily(
            "ballast_route_requests", "Requests matched to each route", labels=["route"]
        )
        state = GaugeMetricFamily(
            "ballast_route_breaker_state",
            "1 for the state each route's circuit breaker is in",
            labels=["route", "state"],
        )
        for name, count in sorted(routes.counts.items()):
            requests.add_metric([name], float(count))
            current = breakers.get(name).state(now) if breakers.keyed else None
            for s in BreakerState:
                if current is not None:
                    state.add_metric([name, s.value], float(current is s))
        yield requests
        yield state
