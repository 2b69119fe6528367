"""An optional JSON access log: one line per request, off by default (``access_log.enabled``).

Each line is one JSON object written with a single ``write`` to stdout::

    {"ts": 1764590000.123, "method": "GET", "path": "/api", "route": "/api",
     "status": 200, "priority": "standard", "shed": null, "queue_wait_ms": 0.4,
     "upstream": "http://10.0.0.7:8000", "duration_ms": 12.3}

``AccessLog`` wraps the whole gateway (it sees the status the client got and
the total duration); ``AccessLog.inner`` wraps the terminal app, where the
request context exists, and hands it out through a holder in the scope (the
stages pass shallow copies of the scope down, so the holder is shared).
A request shed before the terminal app has no context: its reason comes from
``X-Ballast-Reason``, its tier from ``classify``, and its route is null. The query string is never
logged (it may carry secrets). Cost: see docs/deploy.md ("Access log").
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

from ballast_asgi.core.types import ASGIApp, Receive, Scope, Send
from ballast_asgi.middleware.context import find_context

__all__ = ["AccessLog"]

_HOLDER = "ballast.access_log"
#: The tier of a request shed before the terminal app ran: (scope) -> name.
Classify = Callable[[Scope], str | None]


class AccessLog:
    """Write one JSON line per HTTP request after its response (or abort)."""

    def __init__(self, app: ASGIApp, *, classify: Classify, stream: TextIO | None = None) -> None:
        self.app = app
        self.classify = classify
        self.stream = stream

    @staticmethod
    def inner(app: ASGIApp) -> ASGIApp:
        """Wrap the terminal app: record the request context for the outer log line."""

        async def record(scope: Scope, receive: Receive, send: Send) -> None:
            holder = scope.get(_HOLDER)
            if holder is not None:
                holder["ctx"] = find_context(scope)
            await app(scope, receive, send)

        return record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        holder: dict[str, Any] = {"status": None, "reason": None, "ctx": None}

        async def watch(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                holder["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == b"x-ballast-reason":
                        holder["reason"] = value.decode("latin-1")
            await send(message)

        try:
            await self.app({**scope, _HOLDER: holder}, receive, watch)
        finally:
            self._write(scope, holder, time.monotonic() - started)

    def _write(self, scope: Scope, holder: dict[str, Any], duration_s: float) -> None:
        ctx = holder["ctx"]
        upstreams = getattr(ctx, "tried_upstreams", ()) if ctx is not None else ()
        line = {
            "ts": round(time.time(), 3),
            "method": scope["method"],
            "path": scope["path"],
            "route": ctx.route.name if ctx is not None and ctx.route is not None else None,
            "status": holder["status"],
            "priority": ctx.priority.label if ctx is not None else self.classify(scope),
            "shed": holder["reason"],
            "queue_wait_ms": round(ctx.queue_wait_s * 1000.0, 3) if ctx is not None else None,
            "upstream": str(upstreams[-1]) if upstreams else None,
            "duration_ms": round(duration_s * 1000.0, 3),
        }
        stream = self.stream or sys.stdout
        stream.write(json.dumps(line, separators=(",", ":")) + "\n")
