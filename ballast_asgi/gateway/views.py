"""What the gateway shows: its live pieces by name, its health and its snapshot.

``GatewayViews`` is the read side of ``Gateway`` (``gateway/root.py``): the
long-lived pieces (``pieces``, ADR 0019) and the current stack (``stack``,
replaced whole by a reload) under their historical names (``config``,
``parts``, ``pool``, ``proxy`` ...), the ``server``/``websocket`` sections the
server reads at start-up, and the documents the admin endpoints serve:
``health`` (``/health``), ``degraded`` and ``snapshot`` (``/snapshot``). It
reads and never changes anything but the test setters ``_app``/``_stack``;
building, serving requests and reloading stay in ``root``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from ballast_asgi.canary.asgi import CanaryRuntime
from ballast_asgi.config import GatewayConfig
from ballast_asgi.config.models import ServerConfig, WebSocketConfig
from ballast_asgi.core import native
from ballast_asgi.core.adopt import protocol
from ballast_asgi.core.redact import redact_userinfo
from ballast_asgi.core.types import ASGIApp, Clock
from ballast_asgi.discovery.runtime import DiscoveryRuntime
from ballast_asgi.gateway.compose import Live, Stack
from ballast_asgi.gateway.parts import Parts
from ballast_asgi.ops.admin import AdminRouter
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.websocket import WebSocketProxy
from ballast_asgi.upstreams.runtime import PoolRuntime, plain_snapshot


class GatewayViews:
    """The gateway's read side (``Gateway`` sets every attribute declared here)."""

    clock: Clock
    #: The long-lived pieces (built once; every reload keeps them, ADR 0019).
    pieces: Live
    #: The stack requests run through; replaced whole (one assignment) by a reload.
    stack: Stack
    version: int
    loaded_at: float
    #: Set when a graceful shutdown begins: health answers 503 ``draining``.
    draining: bool
    #: ``ballast --workers N``: this process's index, N and PID (shown in the snapshot).
    worker: dict[str, int] | None
    #: ``workers.redivide_on_loss``: the live-worker count the caps are divided by now
    #: (None: by N).
    live: int | None

    @property
    def config(self) -> GatewayConfig:
        """The config the current stack was built from."""
        return self.stack.config

    @property
    def parts(self) -> Parts:
        """The stages' collaborators (limiter, queue, breakers, budget, ...)."""
        return self.pieces.parts

    @property
    def pool(self) -> PoolRuntime | None:
        """The upstream pool (None for a single URL)."""
        return self.pieces.pool

    @property
    def discovery(self) -> DiscoveryRuntime | None:
        """The discovery runtime (None without ``discovery``)."""
        return self.pieces.discovery

    @property
    def canary(self) -> CanaryRuntime | None:
        """The canary (None without ``canary.upstream``)."""
        return self.pieces.canary

    @property
    def proxy_app(self) -> ProxyApp:
        """The terminal proxy."""
        return self.pieces.proxy_app

    @property
    def proxy(self) -> ASGIApp:
        """The terminal app (the pool's proxy is wrapped so lifespan runs its probes)."""
        return self.pieces.proxy

    @property
    def websockets(self) -> WebSocketProxy:
        """The WebSocket relay (upgrades bypass the HTTP stages)."""
        return self.pieces.websockets

    @property
    def _app(self) -> ASGIApp:
        return self.stack.app

    @_app.setter
    def _app(self, app: ASGIApp) -> None:  # tests put a spy in place of the chain
        self.stack = replace(self.stack, app=app)

    @property
    def _router(self) -> AdminRouter:
        return self.stack.router

    @property
    def _stack(self) -> ASGIApp | None:
        return self.stack.direct

    @_stack.setter
    def _stack(self, app: ASGIApp | None) -> None:
        self.stack = replace(self.stack, direct=app)

    def health(self) -> tuple[int, dict[str, Any]]:
        """200 ``ok``; 200 ``degraded`` with reasons when a dependency is lost (Redis,
        etcd, every instance failing its probes); 503 ``draining`` once a shutdown began."""
        if self.draining:
            return 503, {"status": "draining"}
        reasons = self.degraded()
        if reasons:
            return 200, {"status": "degraded", "reasons": reasons}
        return 200, {"status": "ok"}

    def degraded(self) -> list[str]:
        """Why the gateway runs degraded (empty when it does not): one line per cause."""
        reasons = self.pool.degraded() if self.pool is not None else []
        if self.parts.ratelimit is not None and self.config.rate_limit.enabled:
            reasons += self.parts.ratelimit.degraded()
        if self.discovery is not None:
            reasons += self.discovery.degraded()
        now = self.clock()
        routes = self.parts.breakers.open_keys(now)
        if routes:  # per-route breakers (breaker.scope: route)
            more = " ..." if len(routes) > 8 else ""
            names = ", ".join(routes[:8])
            reasons.append(f"breaker: open on routes {names}{more} (those routes are shed)")
        elif self.parts.breaker.state(now).value == "open":
            reasons.append("breaker: open (the upstream is failing; requests are shed)")
        return reasons

    @property
    def server_config(self) -> ServerConfig:
        """The ``server`` section (settings of the HTTP server in front of the gateway)."""
        return self.config.server

    @property
    def server_protocol(self) -> type[Any] | None:
        """The server protocol class the gateway form installs: the shed at the wire
        (``server.shed_at_wire``; ``ballast_asgi.server.wire``, handed out through
        ``core.adopt``), or None: the guarded protocol alone."""
        return protocol("shed_at_wire") if self.config.server.shed_at_wire else None

    @property
    def websocket_config(self) -> WebSocketConfig:
        """The ``websocket`` section (uvicorn's websocket limits are set from it)."""
        return self.config.websocket

    def snapshot(self) -> dict[str, Any]:
        """The live state of every stage as one JSON-safe document."""
        doc = self.parts.snapshot(self.clock())
        doc["upstreams"] = (
            self.pool.snapshot()
            if self.pool is not None
            else plain_snapshot(self.proxy_app.selector)
        )
        if self.pool is not None:
            doc["pool"] = self.pool.summary()
        doc["degraded"] = self.degraded()
        doc["config"] = {
            "version": self.version,
            "loaded_at": self.loaded_at,
            "upstream": (
                redact_userinfo(self.config.upstream)
                if isinstance(self.config.upstream, str)
                else [u["url"] for u in doc["upstreams"]]
            ),
            "limiter": self.config.limiter.algorithm,
            "dry_run": self.config.load_shed_dry_run,
        }
        doc["worker"] = self.worker or {"index": 0, "of": 1, "pid": os.getpid()}
        if self.live is not None:
            doc["worker"] = {**doc["worker"], "caps_divided_by": self.live}
        if self.discovery is not None:  # the applied config version (docs/discovery.md)
            doc["config_version"] = self.discovery.config_version
            doc["discovery"] = self.discovery.snapshot()
        doc["canary"] = {"state": "none"} if self.canary is None else self.canary.snapshot()
        doc["websocket"] = self.websockets.snapshot()
        doc["native"] = native.status()  # the compiled cores in use, or why not (ADR 0021)
        return doc
