"""The gateway app with a per-request trace, for the experiment's decision-time check.

``uvicorn experiments.ratelimit.traced:app`` serves ``ballast_asgi.gateway:app``
unchanged and records, for every request carrying ``x-seq``, the moment it
reached the app (``time.monotonic()``: the rate-limit stage decides within
microseconds of it; in ``local`` and ``sync`` mode nothing awaits before the
decision) and the status it answered. ``GET /_trace`` returns the records as
JSON and clears them. On Linux ``time.monotonic()`` and the generator's
``time.perf_counter()`` read the same clock (``CLOCK_MONOTONIC``), so the
gateways' decision times and the generator's send times can be compared.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from ballast_asgi.core.types import ASGIApp, Message, Receive, Scope, Send
from ballast_asgi.serve import adopt_uvicorn


class Traced:
    """Wraps an ASGI app; keeps ``(seq, arrived, status)`` per traced request."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner
        self.records: list[tuple[int, float, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        if scope["path"] == "/_trace":
            await self._dump(send)
            return
        arrived = time.monotonic()
        seq = next((int(v) for k, v in scope["headers"] if k == b"x-seq"), -1)
        if seq < 0:
            await self.inner(scope, receive, send)
            return
        records = self.records

        async def traced_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                records.append((seq, arrived, int(message["status"])))
            await send(message)

        await self.inner(scope, receive, traced_send)

    async def _dump(self, send: Send) -> None:
        body = json.dumps(self.records).encode()
        self.records = []
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


_app: Traced | None = None


def __getattr__(name: str) -> Any:
    """Build ``app`` on first access, like ``ballast_asgi.gateway`` (and adopt uvicorn)."""
    global _app
    if name != "app":
        raise AttributeError(name)
    import ballast_asgi.gateway as gateway

    if _app is None:
        _app = Traced(gateway.app)
    adopt_uvicorn(gateway.app, sys._getframe(1))
    return _app
