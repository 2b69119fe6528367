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

from ballast_asgi._lazy import lazy_getattr

if TYPE_CHECKING:
    from ballast_asgi.config import GatewayConfig, load_config
    from ballast_asgi.core.outcome import ShedReason
    from ballast_asgi.core.priority import Priority
    from ballast_asgi.embed import Ballast, BallastStack, install, wrap
    from ballast_asgi.middleware.context import RequestContext, get_context

_LAZY = {
    "GatewayConfig": "ballast_asgi.config",
    "load_config": "ballast_asgi.config",
    "ShedReason": "ballast_asgi.core.outcome",
    "Priority": "ballast_asgi.core.priority",
    "Ballast": "ballast_asgi.embed",
    "BallastStack": "ballast_asgi.embed",
    "install": "ballast_asgi.embed",
    "wrap": "ballast_asgi.embed",
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


__getattr__ = lazy_getattr("ballast_asgi", _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(__all__)
