"""A lean connection whose answer was a 500 rests before reuse (``lean.py``, ``REST_S``).

uvicorn closes the connection right after the 500 of an unhandled exception
without ``Connection: close``; a request written on it in that moment failed.
"""

from __future__ import annotations

import asyncio

import pytest

from ballast_asgi.proxy.transports.lean import LeanTransport
from tests.lean_support import Raw, answering, body_of, get, raw_upstream

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
ERROR = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nerror"

pytestmark = pytest.mark.anyio


async def test_a_connection_the_upstream_closes_after_its_500_is_not_reused() -> None:
    """The upstream answers 500 and closes that connection only once the gateway has opened
    another (uvicorn's close after an exception, made later than any reuse): the next
    request goes on the new connection and is answered; none is written on the old one."""
    second = asyncio.Event()

    async def uvicorn_like(raw: Raw, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if raw.connections == 1:
            await raw.head(reader)
            w.write(ERROR)
            await second.wait()  # the close comes after the next request was placed
            return  # ``raw_upstream`` closes the connection
        second.set()
        await raw.head(reader)
        w.write(OK)
        await reader.read()

    async with raw_upstream(uvicorn_like) as (raw, up):
        transport = LeanTransport()
        async with asyncio.timeout(10.0):  # a hang fails the test instead of blocking it
            assert await body_of(await get(transport, up)) == b"error"
            assert await body_of(await get(transport, up)) == b"ok"
        await transport.aclose()
    assert raw.connections == 2 and len(raw.heads) == 2


async def test_a_connection_kept_after_its_500_comes_back_after_the_rest() -> None:
    """An upstream that keeps the connection after a 500: it rests (not idle, still counted
    open), then returns to the pool, and the next request reuses it: no reconnect."""
    async with raw_upstream(answering(ERROR, OK)) as (raw, up):
        transport = LeanTransport()
        pool = transport._pool
        pool.rest_s = 0.0  # the rest is a timer: here, the next loop turn
        assert await body_of(await get(transport, up)) == b"error"
        assert pool.resting == 1 and pool.idle_count == 0 and pool.in_use == 0
        for _ in range(3):
            await asyncio.sleep(0)  # loop turns: the rest's timer runs
        assert pool.resting == 0 and pool.idle_count == 1
        assert await body_of(await get(transport, up)) == b"ok"
        await transport.aclose()
    assert raw.connections == 1


async def test_a_resting_connection_counts_against_the_limit() -> None:
    """With one connection allowed, a request during the rest waits for it (it does not open
    a second one) and is answered on it once the rest is over."""
    async with raw_upstream(answering(ERROR, OK)) as (raw, up):
        transport = LeanTransport(max_connections=1)
        pool = transport._pool
        pool.rest_s = 0.0
        assert await body_of(await get(transport, up)) == b"error"
        assert pool.resting == 1
        async with asyncio.timeout(10.0):
            assert await body_of(await get(transport, up)) == b"ok"
        await transport.aclose()
    assert raw.connections == 1


async def test_a_200_is_reused_at_once() -> None:
    """Only a 500 rests: after a 200 the connection is idle at once."""
    async with raw_upstream(answering(OK, OK)) as (raw, up):
        transport = LeanTransport()
        assert await body_of(await get(transport, up)) == b"ok"
        assert transport._pool.resting == 0 and transport._pool.idle_count == 1
        assert await body_of(await get(transport, up)) == b"ok"
        await transport.aclose()
    assert raw.connections == 1
