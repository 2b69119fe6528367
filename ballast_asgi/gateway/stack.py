"""Build the four stages around an inner ASGI app from one ``GatewayConfig``.

Shared by the standalone gateway (inner app: ``ProxyApp``) and by
``ballast_asgi.gateway.embed`` (inner app: the user's own handlers). The stateful
collaborators live in ``Parts`` so that a config reload can rebuild the
(stateless) middleware chain around the same limiter, queue and breaker
without dropping an in-flight or queued request.
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
from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.early_drop import EarlyDropEstimator, make_drain_estimate
from ballast_asgi.core.head import HeadLimits
from ballast_asgi.core.limit import LimitAlgorithm, make_limit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.queue import PriorityQueue
from ballast_asgi.core.retry_budget import RetryBudget
from ballast_asgi.core.routes import RouteTable
from ballast_asgi.core.types import ASGIApp, Clock
from ballast_asgi.gateway.routing import (
    RouteCollector,
    build_breakers,
    build_routes,
    routes_snapshot,
)
from ballast_asgi.middleware.admission import AdmissionMiddleware, RouteKey
from ballast_asgi.middleware.body import BodyMiddleware
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.capacity import CapacityMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware
from ballast_asgi.middleware.pipeline import Pipeline, Stages
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.middleware.ratelimit import RateLimitMiddleware
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.middleware.retry import RetryMiddleware
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


def make_partition(
    config: GatewayConfig, rng: random.Random
) -> Callable[[bool], LimitAlgorithm] | None:
    """The per-route algorithm factory (ADR 0016), or None for one limit.

    With an upstream pool and ``upstreams.per_instance_limit`` there is none:
    the per-instance limits are the partitions (``PoolLimit``, ``limiter_for``).
    """
    lc = config.limiter
    if lc.algorithm == "fixed" or not (lc.partition_by_route or own_routes(config)):
        return None

    def build(quiet: bool) -> LimitAlgorithm:
        initial = max(lc.initial_limit, lc.quiet_limit) if quiet else lc.initial_limit
        return make_algorithm(config, rng, initial_limit=initial)

    return build


def own_routes(config: GatewayConfig) -> frozenset[str] | None:
    """Routes with a partition of their own: None (every route) with
    ``limiter.partition_by_route``, else the configured routes that ask for one."""
    if config.limiter.partition_by_route:
        return None
    return frozenset(r.name for r in config.routes if r.limiter.partition)


def make_algorithm(
    config: GatewayConfig, rng: random.Random, *, initial_limit: int | None = None
) -> LimitAlgorithm:
    """The configured limit algorithm, bounded by the config's caps."""
    lc = config.limiter
    if lc.algorithm == "fixed":
        return make_limit("fixed", limit=config.fixed_limit)
    max_limit = config.max_limit
    rules = lc.gradient.model_dump() if lc.algorithm == "gradient" else {}
    initial = lc.initial_limit if initial_limit is None else initial_limit
    return make_limit(
        lc.algorithm,
        initial_limit=min(initial, max_limit),
        min_limit=min(lc.min_limit, max_limit),
        max_limit=max_limit,
        window_ms=lc.window_ms,
        rng=rng,
        **rules,
    )


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
        capacity=_make_capacity(config),
        ratelimit=ratelimit,
        routes=routes,
        pool=pool,
    )
    metrics.registry.register(RouteCollector(lambda: (parts.route_table(), parts.breakers), clock))
    return parts


#: Whether ``build_stack`` returns the stages as one ``Pipeline`` (True) or as the
#: nested middlewares (False); both call the same stage objects (test_compositions.py).
PIPELINE = True


def build_stack(
    inner: ASGIApp,
    parts: Parts,
    config: GatewayConfig,
    *,
    retries: bool,
    route_key: RouteKey | None = None,
    pipeline: bool | None = None,
) -> ASGIApp:
    """Wrap ``inner`` in breaker, retry, concurrency, queue, capacity and admission stages.

    As one ``Pipeline`` object (``pipeline``, default ``PIPELINE``) or as the
    nested middlewares; the same stages and behaviour either way.
    """
    stages = build_stages(inner, parts, config, retries=retries, route_key=route_key)
    return Pipeline(stages) if (PIPELINE if pipeline is None else pipeline) else stages.admission


def build_stages(
    inner: ASGIApp,
    parts: Parts,
    config: GatewayConfig,
    *,
    retries: bool,
    route_key: RouteKey | None = None,
) -> Stages:
    """The stages around ``inner`` as nested middlewares, each one named."""
    breaker = BreakerMiddleware(
        inner, breaker=parts.breakers, responder=parts.responder, metrics=parts.metrics,
        clock=parts.clock,
    )  # fmt: skip
    retry = _retry(breaker, parts, config) if retries and config.retry.enabled else None
    concurrency = ConcurrencyMiddleware(
        retry or breaker, limiter=parts.limiter, responder=parts.responder,
        metrics=parts.metrics, clock=parts.clock,
    )  # fmt: skip
    queue = None
    if config.admission_queue.enabled:
        queue = QueueMiddleware(
            concurrency,
            limiter=parts.limiter,
            queue=parts.queue,
            responder=parts.responder,
            metrics=parts.metrics,
            queue_timeout_ms=config.admission_queue.queue_timeout_ms,
            clock=parts.clock,
        )
    if parts.capacity is None:
        parts.capacity = _make_capacity(config)
    b = config.body
    body = BodyMiddleware(
        queue or concurrency,
        responder=parts.responder,
        metrics=parts.metrics,
        byte_budget=parts.capacity.byte_budget,
        replay_max_bytes=b.replay_max_bytes,
        max_body_bytes=config.proxy.max_body_bytes,
        read_timeout_ms=b.read_timeout_ms,
        min_rate_bytes_per_s=b.min_rate_bytes_per_s,
        clock=parts.clock,
    )
    capacity = CapacityMiddleware(body, capacity=parts.capacity, responder=parts.responder)
    ratelimit = None
    limited = config.rate_limit.enabled or any(r.rate_limit for r in config.routes)
    if limited and parts.ratelimit is not None:
        limits = parts.ratelimit
        ratelimit = RateLimitMiddleware(capacity, runtime=limits, responder=parts.responder)
    admission = _admission(ratelimit or capacity, parts, config, route_key)
    return Stages(admission, ratelimit, capacity, body, queue, concurrency, retry, breaker)


def breaker_and_retry(app: ASGIApp, parts: Parts, config: GatewayConfig, retries: bool) -> ASGIApp:
    breaker = BreakerMiddleware(
        app, breaker=parts.breakers, responder=parts.responder, metrics=parts.metrics,
        clock=parts.clock,
    )  # fmt: skip
    if not (retries and config.retry.enabled):
        return breaker
    return _retry(breaker, parts, config)


def _retry(breaker: BreakerMiddleware, parts: Parts, config: GatewayConfig) -> RetryMiddleware:
    return RetryMiddleware(
        breaker,
        budget=parts.budget,
        metrics=parts.metrics,
        config=config.retry,
        gate=breaker.admits,
        byte_budget=parts.capacity.byte_budget if parts.capacity else None,
        clock=parts.clock,
        rng=parts.rng,
    )


def _admission(
    app: ASGIApp, parts: Parts, config: GatewayConfig, route_key: RouteKey | None
) -> AdmissionMiddleware:
    a = config.admission
    early = EarlyDropEstimator(parts.limiter, parts.queue) if a.early_drop else None
    return AdmissionMiddleware(
        app,
        responder=parts.responder,
        metrics=parts.metrics,
        default_priority=config.priority.default,
        default_deadline_ms=a.default_deadline_ms,
        classifier=Classifier(config.priority),
        early_drop=early,
        limits=HeadLimits(a.max_headers, a.max_header_bytes, config.proxy.max_body_bytes),
        failure_statuses=config.breaker.failure_statuses,
        route_key=route_key,
        routes=parts.route_table(),
        clock=parts.clock,
    )


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


def _make_capacity(config: GatewayConfig) -> Capacity:
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
