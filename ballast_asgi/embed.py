"""Add the stack to an existing Starlette/FastAPI (or any ASGI) app.

``install(app, ...)`` adds one middleware to a Starlette/FastAPI app that
holds the four stages in the right order plus the ``/_ballast/*`` admin paths;
``wrap(app, ...)`` does the same for a plain ASGI callable and returns the
wrapped app. Inside an app there is no remote call to retry, so retries are
off; the breaker still counts the app's 5xx answers as failures.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from ballast_asgi.admin import AdminRouter
from ballast_asgi.config import GatewayConfig, build_config
from ballast_asgi.core.types import ASGIApp, Clock, Receive, Scope, Send
from ballast_asgi.metrics import Metrics
from ballast_asgi.stack import Parts, build_parts, build_stack


class _SupportsAddMiddleware(Protocol):
    def add_middleware(self, middleware_class: Any, *args: Any, **kwargs: Any) -> None: ...


class BallastStack:
    """One middleware holding admin paths and the four stages (for ``add_middleware``)."""

    def __init__(self, app: ASGIApp, *, parts: Parts, config: GatewayConfig) -> None:
        self.parts = parts
        stack = build_stack(app, parts, config, retries=False)
        self._app = AdminRouter(
            stack,
            exposition=parts.metrics.exposition,
            snapshot=lambda: parts.snapshot(parts.clock()),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def _config(config: GatewayConfig | Mapping[str, Any] | None, limiter: str | None) -> GatewayConfig:
    if isinstance(config, GatewayConfig):
        return config if limiter is None else _with_limiter(config, limiter)
    overrides = {} if limiter is None else {"limiter.algorithm": limiter}
    return build_config(config or {}, overrides, source="install", require_upstream=False)


def _with_limiter(config: GatewayConfig, limiter: str) -> GatewayConfig:
    data = config.model_dump()
    data["limiter"]["algorithm"] = limiter
    return GatewayConfig.model_validate(data)


def make_parts(
    config: GatewayConfig | Mapping[str, Any] | None = None,
    *,
    limiter: str | None = None,
    registry: CollectorRegistry | None = None,
    clock: Clock = time.monotonic,
    rng: random.Random | None = None,
) -> tuple[GatewayConfig, Parts]:
    """Validate ``config`` and build the stack's collaborators."""
    cfg = _config(config, limiter)
    return cfg, build_parts(cfg, Metrics(registry), clock=clock, rng=rng)


def install(
    app: _SupportsAddMiddleware,
    config: GatewayConfig | Mapping[str, Any] | None = None,
    *,
    limiter: str | None = None,
    registry: CollectorRegistry | None = None,
    clock: Clock = time.monotonic,
) -> Parts:
    """Protect a Starlette/FastAPI app; returns the live collaborators."""
    cfg, parts = make_parts(config, limiter=limiter, registry=registry, clock=clock)
    app.add_middleware(BallastStack, parts=parts, config=cfg)
    return parts


def wrap(
    app: ASGIApp,
    config: GatewayConfig | Mapping[str, Any] | None = None,
    *,
    limiter: str | None = None,
    registry: CollectorRegistry | None = None,
    clock: Clock = time.monotonic,
) -> BallastStack:
    """Protect any ASGI app; returns the wrapped app (``.parts`` holds the state)."""
    cfg, parts = make_parts(config, limiter=limiter, registry=registry, clock=clock)
    return BallastStack(app, parts=parts, config=cfg)
