"""The route key the concurrency limiter judges a request by (ADR 0016).

The request's route as matched once at admission (``ctx.route.name``: a
configured route, the framework's route template, or an automatic group per
first path segment, bounded by ``auto_routes.max_groups``; docs/routes.md).
Without a route table, or for a request the table put in its overflow group
``other`` (a segment the upstream has not answered yet, or past
``auto_routes.max_groups``): the first path segment (``/delay/1`` ->
``/delay``, ``/`` -> ``/``), cut to ``MAX_SEGMENT`` characters, so a burst to
an endpoint never seen before gets a limit of its own (ADR 0016). Either way
the limiter keeps at most ``limiter.max_routes`` keys (idle ones make room)
and puts the rest in one overflow entry (``~other``).
"""

from __future__ import annotations

from ballast_asgi.core.routes import Route
from ballast_asgi.core.types import Scope
from ballast_asgi.middleware.context import RequestContext

#: Longest first path segment kept in a key.
MAX_SEGMENT = 48


def limit_route(scope: Scope, ctx: RequestContext) -> str:
    """The request's limiter route key."""
    return limit_key(ctx.route, scope.get("path"))


def limit_key(route: Route | None, path: str | None) -> str:
    """The limiter route key of a request on ``route`` for ``path`` (``limit_route``)."""
    if route is not None and route.source != "overflow":
        return route.name
    path = path or "/"
    segment = path.split("/", 2)[1] if path.startswith("/") else ""
    return "/" + segment[:MAX_SEGMENT]
