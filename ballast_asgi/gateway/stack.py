"""Build the stages around an inner ASGI app from one ``GatewayConfig``.

Shared by the standalone gateway (inner app: ``ProxyApp``) and by
``ballast_asgi.gateway.embed`` (inner app: the user's own handlers). The stateful
collaborators live in ``Parts`` (``parts.py``; the limit algorithms in
``limits.py``) so that a config reload can rebuild the (stateless) middleware
chain around the same limiter, queue and breaker without dropping an in-flight
or queued request. The names of those two modules stay importable from here.
"""

from __future__ import annotations

from ballast_asgi.config import GatewayConfig
from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.early_drop import EarlyDropEstimator
from ballast_asgi.core.head import HeadLimits
from ballast_asgi.core.types import ASGIApp
from ballast_asgi.gateway.limits import make_algorithm, make_partition, own_routes
from ballast_asgi.gateway.parts import (
    NO_POOL,
    Parts,
    PoolFacts,
    build_parts,
    make_capacity,
    reconfigure_parts,
)
from ballast_asgi.middleware.admission import AdmissionMiddleware, RouteKey
from ballast_asgi.middleware.body import BodyMiddleware
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.capacity import CapacityMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware
from ballast_asgi.middleware.pipeline import Pipeline, Stages
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.middleware.ratelimit import RateLimitMiddleware
from ballast_asgi.middleware.retry import RetryMiddleware

__all__ = [
    "NO_POOL",
    "PIPELINE",
    "Parts",
    "PoolFacts",
    "breaker_and_retry",
    "build_parts",
    "build_stack",
    "build_stages",
    "make_algorithm",
    "make_partition",
    "own_routes",
    "reconfigure_parts",
]


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
        parts.capacity = make_capacity(config)
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
