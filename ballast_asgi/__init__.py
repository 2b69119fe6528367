"""ballast-asgi: overload control for Python web services.

Four pure-ASGI stages (admission with deadlines, priority queue with a LIFO
tail, adaptive concurrency limiter, circuit breaker with a retry budget) and a
terminal proxy. ``install(app)`` protects a Starlette/FastAPI app;
``uvicorn ballast_asgi.gateway:app`` runs the standalone gateway.

The names below are what a FastAPI user needs; the stages and their
collaborators live in ``ballast_asgi.middleware``. Imports are lazy, so
``import ballast_asgi.core.limit.fixed`` loads nothing heavy.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

from ballast_asgi.core import native as _native

_native.install()  # the compiled cores when built and current (ADR 0021); first of all

from ballast_asgi.core import adopt as _adopt  # noqa: E402
from ballast_asgi.core._lazy import lazy_getattr, moved_modules  # noqa: E402

if TYPE_CHECKING:
    from ballast_asgi.config import GatewayConfig, load_config
    from ballast_asgi.core.outcome import ShedReason
    from ballast_asgi.core.priority import Priority
    from ballast_asgi.gateway.embed import Ballast, BallastStack, install, wrap
    from ballast_asgi.middleware.context import RequestContext, get_context

_LAZY = {
    "GatewayConfig": "ballast_asgi.config",
    "load_config": "ballast_asgi.config",
    "ShedReason": "ballast_asgi.core.outcome",
    "Priority": "ballast_asgi.core.priority",
    "Ballast": "ballast_asgi.gateway.embed",
    "BallastStack": "ballast_asgi.gateway.embed",
    "install": "ballast_asgi.gateway.embed",
    "wrap": "ballast_asgi.gateway.embed",
    "RequestContext": "ballast_asgi.middleware.context",
    "get_context": "ballast_asgi.middleware.context",
}

try:
    __version__ = metadata.version("ballast-asgi")
except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0+unknown"

__all__ = [
    "Ballast",
    "BallastStack",
    "GatewayConfig",
    "Priority",
    "RequestContext",
    "ShedReason",
    "__version__",
    "get_context",
    "install",
    "load_config",
    "wrap",
]


#: Where modules lived before the layout by role (ADR 0005, December 2026): the
#: old dotted paths still import, as the same module object, for one release.
_MOVED = {
    "_lazy": "core._lazy",
    "access_log": "ops.access_log",
    "admin": "ops.admin",
    "canary.blocks": "canary.core.blocks",
    "canary.clients": "canary.core.clients",
    "canary.config": "config.canary",
    "canary.evidence": "canary.core.evidence",
    "canary.history": "canary.core.history",
    "canary.judges": "canary.core.judges",
    "canary.rollout": "canary.core.rollout",
    "canary.split": "canary.core.split",
    "check": "server.check",
    "cli": "server.cli",
    "client.config": "client.core.config",
    "client.hosts": "client.core.hosts",
    "client.live": "client.core.live",
    "client.policy": "client.core.policy",
    "client.throttle": "client.core.throttle",
    "discovery.model": "discovery.core.model",
    "discovery.registration": "discovery.core.registration",
    "discovery.versions": "discovery.core.versions",
    "embed": "gateway.embed",
    "events": "telemetry.events",
    "gateway": "gateway.root",
    "loop_lag": "telemetry.loop_lag",
    "metrics": "telemetry.metrics",
    "proxy.lean": "proxy.transports.lean",
    "proxy.lean_wire": "proxy.transports.lean_wire",
    "proxy.pool_guards": "proxy.transports.pool_guards",
    "proxy.transport": "proxy.transports.aiohttp_transport",
    "ratelimit.config": "config.ratelimit",
    "routing": "gateway.routing",
    "serve": "server.serve",
    "serve_tls": "server.tls",
    "serve_ws": "server.ws",
    "stack": "gateway.stack",
    "supervisor": "server.supervisor",
    "upstreams.balancer": "upstreams.core.balancer",
    "upstreams.build": "gateway.pools",
    "upstreams.health": "upstreams.core.health",
    "upstreams.instance": "upstreams.core.instance",
    "upstreams.limit": "upstreams.core.limit",
    "upstreams.outlier": "upstreams.core.outlier",
    "upstreams.pool": "upstreams.core.pool",
    "worker_admin": "server.worker_admin",
    "workers": "server.workers",
}
moved_modules("ballast_asgi", _MOVED)


def _adopt_server(app: object, name: str) -> None:
    """The server package adopts the server loading ``app`` by ``name`` (``core.adopt``)."""
    from ballast_asgi.server.serve import adopt_loading

    adopt_loading(app, name)


def _wire_protocol() -> type:
    """The server protocol that sheds at the wire (``server.shed_at_wire``)."""
    from ballast_asgi.server.wire import WireShedProtocol

    return WireShedProtocol


_adopt.register(_adopt_server)
_adopt.provide_protocol("shed_at_wire", _wire_protocol)

__getattr__ = lazy_getattr("ballast_asgi", _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(__all__)
