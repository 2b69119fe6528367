"""ballast-asgi: overload control for Python web services.

Four pure-ASGI stages (admission with deadlines, priority queue with a LIFO
tail, adaptive concurrency limiter, circuit breaker with a retry budget) and a
terminal proxy. ``install(app)`` protects a Starlette/FastAPI app;
``uvicorn ballast_asgi.gateway:app`` runs the standalone gateway.
"""

from __future__ import annotations

from ballast_asgi.config import GatewayConfig, load_config
from ballast_asgi.context import RequestContext, get_context
from ballast_asgi.install import BallastStack, install, wrap
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.outcomes import Outcome, ShedReason
from ballast_asgi.priority import Priority
from ballast_asgi.proxy import ProxyApp

__version__ = "0.1.0"

__all__ = [
    "AdmissionMiddleware",
    "BallastStack",
    "BreakerMiddleware",
    "ConcurrencyMiddleware",
    "GatewayConfig",
    "Outcome",
    "Priority",
    "ProxyApp",
    "QueueMiddleware",
    "RequestContext",
    "ShedReason",
    "__version__",
    "get_context",
    "install",
    "load_config",
    "wrap",
]
