"""The experiment's upstream: a raw ASGI app that answers 200 with 2 bytes at once."""

from __future__ import annotations

from typing import Any

_HEAD = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
_BODY = {"type": "http.response.body", "body": b"ok"}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """200 ok for every HTTP request; lifespan answered."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send(_HEAD)
    await send(_BODY)
