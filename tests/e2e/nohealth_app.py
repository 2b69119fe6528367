"""An upstream without a health endpoint, for the pool e2e tests (run as its own uvicorn).

Every path answers 200 ``ok`` except ``/health`` (404: the app has none).
``POST /_ctl/fail`` turns it into a 503 source (every path, ``/health``
included); ``GET /_ctl/stats`` says when that happened and when the last
request other than a probe arrived afterwards (wall clock, seconds).
"""

from __future__ import annotations

import json
import time
from typing import Any

STATE: dict[str, Any] = {"failing_since": None, "last_after": None, "served": 0, "after": 0}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The raw ASGI app (lifespan ignored)."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/_ctl/fail":
        STATE["failing_since"] = time.time()
        await _answer(send, 200, b"failing")
    elif path == "/_ctl/stats":
        await _answer(send, 200, json.dumps(STATE).encode())
    elif STATE["failing_since"] is not None:
        if path != "/health":
            STATE["after"] += 1
            STATE["last_after"] = time.time()
        await _answer(send, 503, b"down")
    elif path == "/health":
        await _answer(send, 404, b"not found")
    else:
        STATE["served"] += 1
        await _answer(send, 200, b"ok")


async def _answer(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
