"""A tiny upstream whose endpoints differ 1000x: ``/delay/*`` sleeps 1 s, anything else answers.

``uvicorn experiments.routeprobe.app:app``; ``ROUTEPROBE_SLOW_S`` changes the slow time.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

SLOW_S = float(os.environ.get("ROUTEPROBE_SLOW_S", "1.0"))


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/delay/...`` after ``SLOW_S``, everything else at once (lifespan ignored)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return
    if scope["path"].startswith("/delay"):
        await asyncio.sleep(SLOW_S)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
