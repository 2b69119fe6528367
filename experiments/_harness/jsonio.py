"""JSON over HTTP for the tools: readiness polling, admin snapshots, profile updates."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp

READY_TIMEOUT_S = 20.0


async def wait_ok(
    http: aiohttp.ClientSession, url: str, timeout_s: float = READY_TIMEOUT_S
) -> None:
    """Poll ``url`` (bounded) until it answers 200."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


async def get_json(http: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    """GET ``url`` as a JSON object, None on any failure."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            data = await r.json()
            return data if isinstance(data, dict) else None
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None


async def post_json(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    """POST ``body`` as JSON; raise unless the answer is 200."""
    async with http.post(url, data=json.dumps(body)) as r:
        if r.status != 200:
            raise RuntimeError(f"POST {url} {body} failed: {r.status}")
