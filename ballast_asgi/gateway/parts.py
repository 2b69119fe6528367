"""The stages' long-lived collaborators: built from one config, reconfigured in place.

``Parts`` holds what the stages share and what must survive a reload
(limiter, queue, breakers, retry budget, capacity, rate limits, routes);
``build_parts`` creates them from a ``GatewayConfig`` and the pool's facts
(``PoolFacts``), ``reconfigure_parts`` applies a new config to the live ones,
keeping in-flight state where the ADRs say it carries over (ADR 0019). The
stages around them are built in ``stack.py``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from ballast_asgi.config import GatewayConfig
from ballast_asgi.core.breaker import Breaker
from ballast_asgi.core.breaker_set import BreakerSet
from ballast_asgi.core.capacity import Capacity
from ballast_asgi.core.early_drop import make_drain_estimate
from ballast_asgi.core.limit import LimitAlgorithm
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.queue import PriorityQueue
from ballast_asgi.core.retry_budget import RetryBudget
from ballast_asgi.core.routes import RouteTable
from ballast_asgi.core.types import Clock
from ballast_asgi.gateway.limits import make_algorithm, make_partition, own_routes
from ballast_asgi.gateway.routing import (
    RouteCollector,
    build_breakers,
    build_routes,
    routes_snapshot,
)
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.ratelimit.metrics import RateLimitCollector
from ballast_asgi.ratelimit.runtime import RateLimitRuntime
from ballast_asgi.telemetry.loop_lag import LoopLagMonitor
from ballast_asgi.telemetry.metrics import Metrics


@dataclass(frozen=True)
class PoolFacts:
    """What a stack's limiter and breakers depend on besides the config: the pool.

    ``limit`` builds the gateway-wide limit as the sum of the instances' own
    (``PoolLimit``; None: the configured algorithm); ``instances`` multiplies
    the breakers' consecutive-failure rule, so one broken instance among N,
    whose failures arrive interleaved with the others' successes, cannot open
    them (the failure-ratio rule still opens them when the pool fails).
    """

    limit: Callable[[], LimitAlgorithm] | None = None
    instances: int = 1


#: No pool: the configured algorithm, breakers as configured.
NO_POOL = PoolFacts()


@dataclass(eq=False)
class Parts:
    """The long-lived, stateful collaborators of one stack."""

    metrics: Metrics
    responder: ShedResponder
    limiter: Limiter
    queue: PriorityQueue
    breakers: BreakerSet
    budget: RetryBudget
    clock: Clock
    rng: random.Random
    #: The held-requests / buffered-bytes cap (CapacityMiddleware).
    capacity: Capacity | None = None
    #: Per-key rate limits (RateLimitMiddleware); built even when disabled, started lazily.
    ratelimit: RateLimitRuntime | None = None
    #: The route table (admission matches each request once; bounded).
    routes: RouteTable | None = None
    #: The pool facts the limiter and breakers were built for.
    pool: PoolFacts = NO_POOL

    @property
    def breaker(self) -> Breaker:
        """The default (un-keyed) breaker."""
        return self.breakers.default

    @breaker.setter
    def breaker(self, breaker: Breaker) -> None:
        """Replace the breakers with this one for every key."""
        self.breakers = BreakerSet(lambda: breaker, max_keys=0)

    def route_table(self) -> RouteTable:
        """The route table (an automatic-groups-only one when none was built)."""
        if self.routes is None:
            self.routes = RouteTable()
        return self.routes

    def snapshot(self, now: float) -> dict[str, Any]:
        """Every collaborator's state as one JSON-safe document."""
        return {
            "routes": routes_snapshot(self.route_table(), self.breakers, now),
            "limiter": self.limiter.snapshot(now),
            "queue": self.queue.snapshot(),
            "breaker": self.breakers.snapshot(now),
            "retry_budget": self.budget.snapshot(now),
            "shed": _shed_counts(self.metrics),
            "dry_run": {
                "enabled": self.responder.dry_run,
                "would_shed": _shed_counts(self.metrics, self.metrics.dry_run_shed),
            },
            "capacity": self.capacity.snapshot() if self.capacity else None,
            "rate_limit": self.ratelimit.snapshot() if self.ratelimit else None,
        }


def _pool_limit(config: GatewayConfig, pool: PoolFacts) -> LimitAlgorithm | None:
    """The per-instance limits' sum, when the pool has them and the algorithm adapts."""
    if pool.limit is None or config.limiter.algorithm == "fixed":
        return None
    return pool.limit()


def build_parts(
    config: GatewayConfig,
    metrics: Metrics,
    *,
    clock: Clock = time.monotonic,
    rng: random.Random | None = None,
    pool: PoolFacts = NO_POOL,
) -> Parts:
    """Create the collaborators described by ``config`` (and ``pool``, ADR 0019)."""
    rng = rng or random.Random()
    sc = config.shed
    responder = ShedResponder(
        metrics, status=sc.status, status_by_reason=sc.status_by_reason,
        jitter=sc.retry_after_jitter, rng=rng,
    )  # fmt: skip
    cap = config.max_concurrent_requests
    lag = LoopLagMonitor() if config.limiter.subtract_loop_lag else None  # ADR 0010
    pooled = _pool_limit(config, pool)
    limiter = Limiter(
        make_algorithm(config, rng) if pooled is None else pooled,
        max_limit=cap,
        loop_lag=lag,
        partition=make_partition(config, rng) if pooled is None else None,
        max_partitions=config.limiter.max_routes,
        own_routes=own_routes(config) if pooled is None else None,
    )
    q = config.admission_queue
    queue = PriorityQueue(
        max_size=q.max_queue_size,
        lifo_threshold=q.lifo_threshold,
        per_priority=q.per_priority,
        reserved_fraction=q.reserved_fraction,
    )
    responder.drain_estimate = make_drain_estimate(queue, limiter, clock)
    responder.dry_run = config.load_shed_dry_run
    ratelimit = _make_ratelimit(config, metrics, clock)
    routes = build_routes(config)
    parts = Parts(
        metrics=metrics,
        responder=responder,
        limiter=limiter,
        queue=queue,
        breakers=build_breakers(config, routes, consecutive_scale=pool.instances),
        budget=RetryBudget.from_config(config.retry),
        clock=clock,
        rng=rng,
        capacity=make_capacity(config),
        ratelimit=ratelimit,
        routes=routes,
        pool=pool,
    )
    metrics.registry.register(RouteCollector(lambda: (parts.route_table(), parts.breakers), clock))
    return parts


def reconfigure_parts(
    parts: Parts,
    old: GatewayConfig,
    new: GatewayConfig,
    now: float,
    *,
    pool: PoolFacts | None = None,
) -> None:
    """Apply a new config (and pool facts; None: the same as before) to the live
    collaborators, keeping in-flight state: what ``build_parts`` would build from
    ``new`` and ``pool``, with the state the ADRs carry over (ADR 0019)."""
    pool = parts.pool if pool is None else pool
    if (
        new.limiter != old.limiter
        or new.max_concurrent_requests != old.max_concurrent_requests
        or own_routes(new) != own_routes(old)
        or (pool.limit is None) != (parts.pool.limit is None)
    ):
        pooled = _pool_limit(new, pool)
        parts.limiter.set_algorithm(
            make_algorithm(new, parts.rng) if pooled is None else pooled,
            max_limit=new.max_concurrent_requests,
            now=now,
            partition=make_partition(new, parts.rng) if pooled is None else None,
            own_routes=own_routes(new) if pooled is None else None,
        )
        parts.limiter.max_partitions = new.limiter.max_routes
    if new.limiter.subtract_loop_lag != (parts.limiter.loop_lag is not None):
        parts.limiter.loop_lag = LoopLagMonitor() if new.limiter.subtract_loop_lag else None
    q = new.admission_queue
    parts.queue.reconfigure(
        max_size=q.max_queue_size,
        lifo_threshold=q.lifo_threshold,
        per_priority=q.per_priority,
        reserved_fraction=q.reserved_fraction,
    )
    parts.responder.set_statuses(new.shed.status, new.shed.status_by_reason)
    parts.responder.dry_run = new.load_shed_dry_run
    if parts.capacity is not None:
        c = new.capacity
        parts.capacity.reconfigure(c.max_held_requests, c.max_buffered_bytes, c.reserved_fraction)
    parts.responder.jitter = new.shed.retry_after_jitter
    if new.routes != old.routes or new.auto_routes != old.auto_routes:
        counts = parts.route_table().counts
        parts.routes = build_routes(new)
        parts.routes.counts.update(counts)  # the requests counter keeps counting
    if (
        new.breaker != old.breaker
        or new.routes != old.routes
        or new.auto_routes != old.auto_routes
        or pool.instances != parts.pool.instances
    ):
        parts.breakers = build_breakers(new, parts.route_table(), pool.instances)
    parts.pool = pool
    if new.retry != old.retry:
        parts.budget = RetryBudget.from_config(new.retry)
    if parts.ratelimit is not None and new.rate_limit != old.rate_limit:
        parts.ratelimit.reconfigure(new.rate_limit, new.priority.consumers.header)


def _make_ratelimit(config: GatewayConfig, metrics: Metrics, clock: Clock) -> RateLimitRuntime:
    runtime = RateLimitRuntime(
        config.rate_limit, consumer_header=config.priority.consumers.header, clock=clock
    )
    metrics.registry.register(
        RateLimitCollector(lambda: runtime.limiter if runtime.config.enabled else None)
    )
    return runtime


def make_capacity(config: GatewayConfig) -> Capacity:
    c = config.capacity
    return Capacity(
        c.max_held_requests,
        max_buffered_bytes=c.max_buffered_bytes,
        reserved_fraction=c.reserved_fraction,
    )


def _shed_counts(metrics: Metrics, counter: Counter | None = None) -> dict[str, dict[str, float]]:
    counts: dict[str, dict[str, float]] = {}
    for family in (metrics.shed if counter is None else counter).collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.value:
                by_reason = counts.setdefault(sample.labels["reason"], {})
                by_reason[sample.labels["priority"]] = sample.value
    return counts
