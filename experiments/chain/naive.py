"""The naive baseline: tenacity-style retries at every layer, no deadline propagation.

``naive_call`` is what a service written with ``tenacity`` (``stop_after_attempt(3)``,
``wait_random_exponential(multiplier=0.05, max=1)``, a fixed per-attempt timeout)
does, written out so the experiment needs no new dependency: each attempt
has its own ``timeout_s``; a timeout, a connect error or a 5xx is retried
after a full-jitter wait, up to ``attempts`` attempts; nothing knows the
caller's deadline, so nothing stops when the caller gives up.

``NaiveProxy`` is the naive chain's gateway: a raw ASGI reverse proxy doing
``naive_call`` towards its upstream with the client's headers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

ATTEMPTS = 3
TIMEOUT_S = 1.0
WAIT_MULTIPLIER_S = 0.05
WAIT_MAX_S = 1.0

Send = Callable[[], Awaitable[int]]


def naive_wait_s(retry: int, rng: random.Random) -> float:
    """tenacity's ``wait_random_exponential(multiplier, max)`` before retry ``retry`` (1-based)."""
    return rng.uniform(0.0, min(WAIT_MAX_S, WAIT_MULTIPLIER_S * 2.0**retry))


async def naive_call(
    send: Send,
    *,
    attempts: int = ATTEMPTS,
    rng: random.Random,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> int:
    """The status of the first attempt that is not a 5xx, else of the last (599: no answer).

    ``send`` makes one attempt (with its own timeout) and returns its status,
    raising on a timeout or connect error.
    """
    status = 599
    for attempt in range(1, attempts + 1):
        try:
            status = await send()
        except (httpx.TransportError, TimeoutError):
            status = 599
        if status < 500:
            return status
        if attempt < attempts:
            await sleep(naive_wait_s(attempt, rng))
    return status


class NaiveProxy:
    """The naive gateway: every request forwarded with ``naive_call`` (GET only, tiny bodies)."""

    def __init__(self, upstream: str, *, seed: int = 1) -> None:
        self.upstream = upstream.rstrip("/")
        self.rng = random.Random(seed)
        self.client: httpx.AsyncClient | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(self, receive, send)
            return
        assert self.client is not None
        client = self.client
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k != b"host"]
        url = self.upstream + scope["path"]

        async def attempt() -> int:
            response = await client.get(url, headers=headers, timeout=TIMEOUT_S)
            return response.status_code

        status = await naive_call(attempt, rng=self.rng)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _lifespan(proxy: NaiveProxy, receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
            proxy.client = httpx.AsyncClient(limits=limits)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if proxy.client is not None:
                await proxy.client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
