"""The websocket upstream of the attacks: ``/echo`` echoes every message, ``/stall`` never reads.

Served by uvicorn in its own process (``python -m uvicorn experiments.wsattack.upstream:app``).
``/stall`` accepts and then waits without calling ``receive()``: uvicorn stops reading
after the first message, so the gateway's writes to it back up (an upstream that stopped
reading).
"""

from __future__ import annotations

import asyncio
from typing import Any


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Echo on ``/echo``; accept and never read on ``/stall``."""
    if scope["type"] != "websocket":
        return
    await receive()
    await send({"type": "websocket.accept"})
    if scope["path"] == "/stall":
        await asyncio.Event().wait()
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        key = "text" if message.get("text") is not None else "bytes"
        await send({"type": "websocket.send", key: message.get(key)})
