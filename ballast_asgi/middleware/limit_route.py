"""The route key the concurrency limiter judges a request by (ADR 0013).

One small function so the key can follow the gateway's route table when it
has one: today it is the request's route when a stage set one (``ctx.route``:
the framework's route template or rule group, as ``breaker.scope: route``
uses), else the first path segment (``/delay/1`` -> ``/delay``, ``/`` ->
``/``), cut to ``MAX_SEGMENT`` characters. Client-chosen paths cannot grow
anything without bound: the limiter keeps at most ``limiter.max_routes``
keys and puts the rest in one overflow entry (``~other``).
"""

from __future__ import annotations

from ballast_asgi.core.types import Scope
from ballast_asgi.middleware.context import RequestContext

#: Longest first path segment kept in a key.
MAX_SEGMENT = 48


def limit_route(scope: Scope, ctx: RequestContext) -> str:
    """The request's limiter route key."""
    if ctx.route:
        return ctx.route
    path = scope.get("path") or "/"
    segment = path.split("/", 2)[1] if path.startswith("/") else ""
    return "/" + segment[:MAX_SEGMENT]
