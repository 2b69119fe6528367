"""The stages as pure-ASGI middlewares, and every collaborator they need.

Outermost first: ``AdmissionMiddleware`` -> ``CapacityMiddleware`` ->
``BodyMiddleware`` -> ``QueueMiddleware`` -> ``ConcurrencyMiddleware`` ->
``RetryMiddleware`` -> ``BreakerMiddleware`` -> (``HandlerMiddleware`` in an
app) -> your app or the proxy. Each middleware is a thin ASGI adapter around its
stage's one decision object (``mw.stage``: ``AdmissionStage``, ``CapacityStage``
...; ADR 0018). ``ballast_asgi.gateway.stack.build_stack`` composes them from one
``GatewayConfig`` and runs them as one ``Pipeline``, which calls the same stage
objects (their common path in one coroutine per request); import from here to
compose them yourself.
Imports are lazy: importing this package loads nothing until a name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ballast_asgi.core._lazy import lazy_getattr

if TYPE_CHECKING:
    from ballast_asgi.core.breaker import Breaker
    from ballast_asgi.core.breaker_set import BreakerSet
    from ballast_asgi.core.capacity import ByteBudget, Capacity
    from ballast_asgi.core.classify import Classifier
    from ballast_asgi.core.head import HeadLimits
    from ballast_asgi.core.limit import make_limit
    from ballast_asgi.core.limiter import Limiter
    from ballast_asgi.core.outcome import AttemptOutcome
    from ballast_asgi.core.queue import PriorityQueue
    from ballast_asgi.core.retry_budget import RetryBudget
    from ballast_asgi.middleware.admission import AdmissionMiddleware
    from ballast_asgi.middleware.body import BodyMiddleware
    from ballast_asgi.middleware.breaker import BreakerMiddleware
    from ballast_asgi.middleware.capacity import CapacityMiddleware
    from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware
    from ballast_asgi.middleware.context import RequestContext, get_context
    from ballast_asgi.middleware.handler import HandlerMiddleware
    from ballast_asgi.middleware.pipeline import Pipeline, Stages
    from ballast_asgi.middleware.queueing import QueueMiddleware
    from ballast_asgi.middleware.responses import ShedResponder
    from ballast_asgi.middleware.retry import RetryMiddleware
    from ballast_asgi.telemetry.metrics import Metrics, null_metrics

_LAZY = {
    "AdmissionMiddleware": "ballast_asgi.middleware.admission",
    "BodyMiddleware": "ballast_asgi.middleware.body",
    "BreakerMiddleware": "ballast_asgi.middleware.breaker",
    "CapacityMiddleware": "ballast_asgi.middleware.capacity",
    "ConcurrencyMiddleware": "ballast_asgi.middleware.concurrency",
    "HandlerMiddleware": "ballast_asgi.middleware.handler",
    "Pipeline": "ballast_asgi.middleware.pipeline",
    "Stages": "ballast_asgi.middleware.pipeline",
    "QueueMiddleware": "ballast_asgi.middleware.queueing",
    "RetryMiddleware": "ballast_asgi.middleware.retry",
    "RequestContext": "ballast_asgi.middleware.context",
    "get_context": "ballast_asgi.middleware.context",
    "ShedResponder": "ballast_asgi.middleware.responses",
    "Metrics": "ballast_asgi.telemetry.metrics",
    "null_metrics": "ballast_asgi.telemetry.metrics",
    "AttemptOutcome": "ballast_asgi.core.outcome",
    "Breaker": "ballast_asgi.core.breaker",
    "BreakerSet": "ballast_asgi.core.breaker_set",
    "ByteBudget": "ballast_asgi.core.capacity",
    "Capacity": "ballast_asgi.core.capacity",
    "Classifier": "ballast_asgi.core.classify",
    "HeadLimits": "ballast_asgi.core.head",
    "Limiter": "ballast_asgi.core.limiter",
    "make_limit": "ballast_asgi.core.limit",
    "PriorityQueue": "ballast_asgi.core.queue",
    "RetryBudget": "ballast_asgi.core.retry_budget",
}

__all__ = [
    "AdmissionMiddleware",
    "AttemptOutcome",
    "BodyMiddleware",
    "Breaker",
    "BreakerMiddleware",
    "BreakerSet",
    "ByteBudget",
    "Capacity",
    "CapacityMiddleware",
    "Classifier",
    "ConcurrencyMiddleware",
    "HandlerMiddleware",
    "HeadLimits",
    "Limiter",
    "Metrics",
    "Pipeline",
    "PriorityQueue",
    "QueueMiddleware",
    "RequestContext",
    "RetryBudget",
    "RetryMiddleware",
    "ShedResponder",
    "Stages",
    "get_context",
    "make_limit",
    "null_metrics",
]


__getattr__ = lazy_getattr("ballast_asgi.middleware", _LAZY, globals())


def __dir__() -> list[str]:
    return list(__all__)
