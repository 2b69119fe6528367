"""BallastTransport against hostile downstreams on a real loopback socket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from ballast_asgi.client import BallastTransport, ClientConfig, DeadlineExceeded, Throttled

pytestmark = pytest.mark.anyio

Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(behaviour: Behaviour) -> AsyncIterator[str]:
    """A raw TCP server on a free loopback port running ``behaviour`` per connection."""
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            await behaviour(reader, writer)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


def _client(deadline_ms: float) -> httpx.AsyncClient:
    config = ClientConfig(default_deadline_ms=deadline_ms, latency_guard=False)
    return httpx.AsyncClient(transport=BallastTransport(config=config))


async def test_dripping_body_cannot_hold_the_call_past_its_budget() -> None:
    """A body sent a byte every 50 ms ends in DeadlineExceeded at the budget, not after 50 s."""

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with raw_server(drip) as url, _client(300) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded) as info:
            await client.get(url)
    assert info.value.sent is True
    assert time.monotonic() - started < 10  # bounded by the budget, far from 1000 x 50 ms


async def test_silent_downstream_raises_deadline_exceeded() -> None:
    """A downstream that never answers is given up at the budget, as DeadlineExceeded."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    async with raw_server(silent) as url, _client(200) as client:
        with pytest.raises(httpx.TimeoutException):
            await client.get(url)


async def test_garbage_retry_after_backs_off_one_second() -> None:
    """A shed whose Retry-After is not a number backs the host off for the default 1 s."""
    arrived = 0

    async def shed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal arrived
        arrived += 1
        writer.write(b"HTTP/1.1 429 Too Many Requests\r\nX-Ballast-Reason: limit\r\n"
                     b"Retry-After: \xff\xfejunk\r\nContent-Length: 0\r\n\r\n")  # fmt: skip
        await writer.drain()

    async with raw_server(shed) as url, _client(5000) as client:
        assert (await client.get(url)).status_code == 429
        with pytest.raises(Throttled) as info:
            await client.get(url)
    assert 0.0 < info.value.retry_after_s <= 1.0
    assert arrived == 1
