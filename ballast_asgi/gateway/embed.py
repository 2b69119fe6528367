"""Add the stack to an existing Starlette/FastAPI (or any ASGI) app.

``install(app, ...)`` adds one middleware to a Starlette/FastAPI app that
holds the stages in the right order plus the ``/_ballast/*`` admin paths and
returns a ``Ballast`` handle (``snapshot()``, ``reload(config)``, the live
``parts``); ``wrap(app, ...)`` does the same for a plain ASGI callable and
returns the wrapped app (its ``.handle``). Inside an app there is no remote
call to retry, so retries are off. The innermost stage is
``HandlerMiddleware``: it records each handler's outcome (5xx and exceptions
are breaker failures) and cancels a handler whose deadline passes (504). The
breaker is keyed by the matched route template (``breaker.scope: route``), so
one failing route cannot shed another's traffic.

**Body size.** In an app the app's own limits rule: the gateway's request
body cap (``proxy.max_body_bytes``, 10 MiB for the standalone gateway) is
lifted unless the config sets it explicitly, so a 12 MB upload reaches the
handler (issue 30). Bodies up to ``body.replay_max_bytes`` are still read
before the request queues; larger ones stream to the handler.

**Processes.** Every limit is per process: under ``uvicorn --workers N`` or
gunicorn each worker has its own limiter, queue, breakers and rate limits, and
``/_ballast/snapshot`` answers from whichever worker took the connection; its
``worker`` section says which (``pid``). Divide the caps by N in the config,
use Redis rate limits for a shared limit, or run the standalone gateway with
``ballast --workers N``, which divides every cap and aggregates the admin port.

Outgoing calls through ``ballast_asgi.client.BallastTransport`` show in the
handle's snapshot (section ``client``) and metrics (``ballast_client_*``):
every live transport of the process, no wiring needed.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from ballast_asgi.client.core.live import client_section
from ballast_asgi.client.metrics import ClientCollector
from ballast_asgi.config import GatewayConfig, build_config
from ballast_asgi.core.types import ASGIApp, Clock, Receive, Scope, Send
from ballast_asgi.gateway.parts import Parts, build_parts, reconfigure_parts
from ballast_asgi.gateway.stack import build_stack
from ballast_asgi.middleware.admission import RouteKey
from ballast_asgi.middleware.handler import HandlerMiddleware
from ballast_asgi.ops.admin import AdminRouter
from ballast_asgi.telemetry.metrics import Metrics


class _SupportsAddMiddleware(Protocol):
    def add_middleware(self, middleware_class: Any, *args: Any, **kwargs: Any) -> None: ...


class Ballast:
    """The handle ``install`` and ``wrap`` return: live state, snapshot and reload.

    ``parts`` holds the collaborators (limiter, queue, breakers, budget, metrics);
    their attributes are also readable on the handle (``handle.limiter``).
    """

    def __init__(
        self, config: GatewayConfig, parts: Parts, route_key: RouteKey | None = None
    ) -> None:
        self.config = config
        self.parts = parts
        self.route_key = route_key
        #: Bumped by ``reload``; each mounted stack rebuilds its chain when it changes.
        self.version = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parts, name)

    def snapshot(self) -> dict[str, Any]:
        """Every stage's live state as one JSON-safe document (as ``/_ballast/snapshot``)."""
        doc = self.parts.snapshot(self.parts.clock())
        doc["config"] = {"version": self.version, "limiter": self.config.limiter.algorithm}
        #: Limits are per process: say which process answered (uvicorn --workers, gunicorn).
        doc["worker"] = {"pid": os.getpid(), "limits": "per_process"}
        doc["client"] = client_section()
        return doc

    def reload(self, config: GatewayConfig | Mapping[str, Any]) -> GatewayConfig:
        """Apply a new config without dropping in-flight or queued requests.

        Raises ``ConfigError`` (nothing applied) when ``config`` is invalid.
        """
        new = _config(config, None)
        reconfigure_parts(self.parts, self.config, new, self.parts.clock())
        self.config = new
        self.version += 1
        return new

    def build(self, app: ASGIApp) -> ASGIApp:
        """The stages around ``app`` for the current config (innermost: the handler stage)."""
        cfg = app_limits_rule(self.config)
        a = cfg.admission
        handler = HandlerMiddleware(
            app,
            metrics=self.parts.metrics,
            cancel_on_deadline=a.cancel_on_deadline,
            deadline_status=a.deadline_status,
            clock=self.parts.clock,
        )
        stack = build_stack(handler, self.parts, cfg, retries=False, route_key=self.route_key)
        return AdminRouter(stack, exposition=self.parts.metrics.exposition, snapshot=self.snapshot)


#: The body cap an app gets when its config does not set one: the largest the key allows.
NO_BODY_CAP = 2**34


def app_limits_rule(config: GatewayConfig) -> GatewayConfig:
    """``config`` with the gateway's body cap lifted unless ``proxy.max_body_bytes`` was set."""
    if "max_body_bytes" in config.proxy.model_fields_set:
        return config
    proxy = config.proxy.model_copy(update={"max_body_bytes": NO_BODY_CAP})
    return config.model_copy(update={"proxy": proxy})


class BallastStack:
    """One middleware holding admin paths and the stages (for ``add_middleware``)."""

    def __init__(self, app: ASGIApp, *, handle: Ballast) -> None:
        self.handle = handle
        self._inner = app
        self._version = handle.version
        self._app = handle.build(app)

    @property
    def parts(self) -> Parts:
        """The live collaborators."""
        return self.handle.parts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._version != self.handle.version:  # reloaded: rebuild around the same parts
            self._version = self.handle.version
            self._app = self.handle.build(self._inner)
        await self._app(scope, receive, send)


def _config(config: GatewayConfig | Mapping[str, Any] | None, limiter: str | None) -> GatewayConfig:
    if isinstance(config, GatewayConfig):
        return config if limiter is None else _with_limiter(config, limiter)
    overrides = {} if limiter is None else {"limiter.algorithm": limiter}
    return build_config(config or {}, overrides, source="install", require_upstream=False)


def _with_limiter(config: GatewayConfig, limiter: str) -> GatewayConfig:
    data = config.model_dump(exclude_unset=True)  # keeps which keys were set (body cap)
    data.setdefault("limiter", {})["algorithm"] = limiter
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
    metrics = Metrics(registry)
    _collect_client_calls(metrics)
    return cfg, build_parts(cfg, metrics, clock=clock, rng=rng)


def _collect_client_calls(metrics: Metrics) -> None:
    """Expose the process's ``BallastTransport`` calls on this registry (once per registry)."""
    with contextlib.suppress(ValueError):  # already there: an earlier install on this registry
        metrics.registry.register(ClientCollector())


def route_template(app: Any) -> RouteKey | None:
    """The breaker key of a Starlette/FastAPI app: the template of the route a request matches.

    None for an app without ``routes`` (a plain ASGI callable): one breaker.
    """
    routes = getattr(app, "routes", None)
    if routes is None:
        return None
    from starlette.routing import Match

    def key(scope: Scope) -> str | None:
        for route in routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return str(getattr(route, "path", "")) or None
        return None

    return key


def install(
    app: _SupportsAddMiddleware,
    config: GatewayConfig | Mapping[str, Any] | None = None,
    *,
    limiter: str | None = None,
    registry: CollectorRegistry | None = None,
    clock: Clock = time.monotonic,
) -> Ballast:
    """Protect a Starlette/FastAPI app; returns the handle (snapshot, reload, parts)."""
    cfg, parts = make_parts(config, limiter=limiter, registry=registry, clock=clock)
    handle = Ballast(cfg, parts, route_template(app))
    app.add_middleware(BallastStack, handle=handle)
    return handle


def wrap(
    app: ASGIApp,
    config: GatewayConfig | Mapping[str, Any] | None = None,
    *,
    limiter: str | None = None,
    registry: CollectorRegistry | None = None,
    clock: Clock = time.monotonic,
) -> BallastStack:
    """Protect any ASGI app; returns the wrapped app (``.handle`` snapshots and reloads)."""
    cfg, parts = make_parts(config, limiter=limiter, registry=registry, clock=clock)
    return BallastStack(app, handle=Ballast(cfg, parts, route_template(app)))
