"""The lean transport against hostile and broken upstreams: clear httpx errors, never a hang."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import Message
from ballast_asgi.middleware.context import RequestContext, with_context
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.transports.aiohttp_transport import client_timeout
from ballast_asgi.proxy.transports.lean import LeanTransport
from ballast_asgi.proxy.upstream import Upstream
from tests.lean_support import Raw, answering, body_of, get, raw_upstream

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter


async def _hold(raw: Raw, reader: Reader, writer: Writer) -> None:
    """Read the request and answer nothing until the client goes."""
    await raw.head(reader)
    await reader.read()


async def _expect(answer: bytes, error: type[Exception], *, max_field_size: int = 65_536) -> None:
    async with raw_upstream(answering(answer)) as (_raw, up):
        transport = LeanTransport(max_field_size=max_field_size)
        with pytest.raises(error):
            await body_of(await get(transport, up))
        assert transport._pool.in_use == 0 and transport._pool.idle_count == 0
        await transport.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "answer",
    [b"NOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n", b"\x00\xff\r\n\r\n",
     b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
     b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n",
     b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n",
     b"HTTP/1.1 200 OK\r\n" + b"X: v\r\n" * 101 + b"Content-Length: 0\r\n\r\n"],
)  # fmt: skip
async def test_garbage_is_a_protocol_error(answer: bytes) -> None:
    """Not HTTP, a bad status (099 is not interim), conflicting lengths, a bad chunk, an unasked
    101, 101 header fields (over the default 100): protocol errors, the connection closed."""
    await _expect(answer, httpx.RemoteProtocolError)


@pytest.mark.anyio
async def test_a_header_field_over_the_limit_is_a_protocol_error() -> None:
    """One header over ``max_field_size`` bytes fails the exchange before any head is passed on."""
    huge = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 2_000 + b"\r\nContent-Length: 0\r\n\r\n"
    await _expect(huge, httpx.RemoteProtocolError, max_field_size=1_024)


@pytest.mark.anyio
async def test_an_endless_head_is_a_protocol_error() -> None:
    """A head that never ends (many small fields) fails once past its bound, not at EOF."""

    async def endless(raw: Raw, reader: Reader, writer: Writer) -> None:
        await raw.head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(100_000):
            writer.write(b"X-%d: v\r\n" % i)
            await writer.drain()

    async with raw_upstream(endless) as (_raw, up):
        transport = LeanTransport(max_field_size=1_024, max_headers=1_000_000)
        with pytest.raises(httpx.RemoteProtocolError, match="head too large"):
            await get(transport, up)
        await transport.aclose()


@pytest.mark.anyio
async def test_a_slow_head_is_a_read_timeout() -> None:
    """No byte of the head within ``sock_read``: ReadTimeout."""
    async with raw_upstream(_hold) as (_raw, up):
        transport = LeanTransport()
        limits = client_timeout({"connect": 1.0, "read": 0.05, "write": 1.0, "pool": 1.0})
        with pytest.raises(httpx.ReadTimeout):
            await get(transport, up, limits=limits)
        await transport.aclose()


@pytest.mark.anyio
async def test_a_chunked_body_that_never_ends_is_cut_at_the_deadline() -> None:
    """A trickling chunked body ends at the request's deadline (``total``) with ReadTimeout."""

    async def trickle(raw: Raw, reader: Reader, writer: Writer) -> None:
        await raw.head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.005)  # the upstream's pace, not a wait for the test

    async with raw_upstream(trickle) as (_raw, up):
        transport = LeanTransport()
        limits = client_timeout({"connect": 1.0, "read": 0.2, "write": 1, "pool": 1, "total": 0.2})
        response = await get(transport, up, limits=limits)
        with pytest.raises(httpx.ReadTimeout):
            await body_of(response)
        await transport.aclose()


@pytest.mark.anyio
async def test_a_body_shorter_than_its_length_then_close_is_a_protocol_error() -> None:
    """EOF before Content-Length bytes: RemoteProtocolError while reading the body."""

    async def short(raw: Raw, reader: Reader, writer: Writer) -> None:
        await raw.head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-this")

    async with raw_upstream(short) as (_raw, up):
        transport = LeanTransport()
        response = await get(transport, up)
        with pytest.raises(httpx.RemoteProtocolError, match="mid-body"):
            await body_of(response)
        await transport.aclose()


@pytest.mark.anyio
async def test_eof_and_reset_before_the_head() -> None:
    """EOF before any byte: RemoteProtocolError; a TCP reset: ReadError (as map_error gives)."""

    async def eof(raw: Raw, reader: Reader, writer: Writer) -> None:
        await raw.head(reader)

    async def reset(raw: Raw, reader: Reader, writer: Writer) -> None:
        await raw.head(reader)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()

    for handler, error in ((eof, httpx.RemoteProtocolError), (reset, httpx.ReadError)):
        async with raw_upstream(handler) as (_raw, up):
            transport = LeanTransport()
            with pytest.raises(error):
                await get(transport, up)
            await transport.aclose()


@pytest.mark.anyio
async def test_a_stale_pooled_connection_fails_once_without_a_hidden_retry() -> None:
    """The upstream drops a kept-alive connection on the next request: one error, one attempt."""

    async def once_then_drop(raw: Raw, reader: Reader, writer: Writer) -> None:
        await raw.head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await raw.head(reader)  # the second request arrives ... and the connection drops

    async with raw_upstream(once_then_drop) as (raw, up):
        transport = LeanTransport()
        assert await body_of(await get(transport, up)) == b"ok"
        with pytest.raises(httpx.RemoteProtocolError):
            await get(transport, up)
        await transport.aclose()
    assert (raw.connections, len(raw.heads)) == (1, 2)


@pytest.mark.anyio
async def test_refused_and_pool_full_are_connect_errors() -> None:
    """Refused: ConnectError; no slot within ``connect``: ConnectTimeout; the slot is freed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = Upstream.parse(f"http://127.0.0.1:{s.getsockname()[1]}")
    transport = LeanTransport(max_connections=1)
    with pytest.raises(httpx.ConnectError):
        await get(transport, closed)
    arrived = asyncio.Event()

    async def hold(raw: Raw, reader: Reader, writer: Writer) -> None:
        await raw.head(reader)
        arrived.set()
        await reader.read()

    async with raw_upstream(hold) as (_raw, up):
        first = asyncio.ensure_future(get(transport, up))
        await arrived.wait()  # the only slot is taken
        limits = client_timeout({"connect": 0.05, "read": 1.0, "write": 1.0, "pool": 0.0})
        with pytest.raises(httpx.ConnectTimeout):
            await get(transport, up, limits=limits)
        first.cancel()  # a caller cancelled while waiting for the head
        with pytest.raises(asyncio.CancelledError):
            await first
        assert transport._pool.in_use == 0 and transport._pool.idle_count == 0
        await transport.aclose()


@pytest.mark.anyio
async def test_the_proxy_answers_502_with_the_outcome_for_a_broken_upstream() -> None:
    """Through ProxyApp on the lean transport: garbage -> 502 and PROTOCOL_ERROR recorded."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async with raw_upstream(answering(b"NOT HTTP\r\n\r\n")) as (_raw, up):
        proxy = ProxyApp(up, transport=LeanTransport())
        ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
        scope = with_context({"type": "http", "method": "GET", "path": "/", "raw_path": b"/",
                              "query_string": b"", "headers": []}, ctx)  # fmt: skip
        await proxy(scope, receive, send)
        await proxy.aclose()
    assert sent[0]["status"] == 502
    assert ctx.outcome is AttemptOutcome.PROTOCOL_ERROR
