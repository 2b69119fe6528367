"""The aiohttp transport's error mapping and settings, against real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
from yarl import URL

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.types import Message
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.transports import AiohttpTransport, DirectResponse, make_transport
from ballast_asgi.proxy.transports.aiohttp_transport import client_timeout
from tests.fakes import BodyEnds

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\nok"


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[str]:
    """An in-process TCP server on a free loopback port; yields its base URL."""
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.close()
        await srv.wait_closed()


async def read_head(reader: asyncio.StreamReader) -> bytes:
    """The request line and headers."""
    return await reader.readuntil(b"\r\n\r\n")


class KeepAlive:
    """A keep-alive upstream answering ``OK`` to every request; counts its connections."""

    def __init__(self) -> None:
        self.connections = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while not reader.at_eof():
            try:
                await read_head(reader)
            except asyncio.IncompleteReadError:
                break
            writer.write(OK)
            await writer.drain()
        writer.close()


async def send_once(url: str, timeouts: dict[str, float] | None = None) -> httpx.Response:
    """One GET through a fresh AiohttpTransport, body read; transport closed afterwards."""
    transport = AiohttpTransport()
    extensions = {"timeout": timeouts} if timeouts else {}
    try:
        request = httpx.Request("GET", url, extensions=extensions)
        response = await transport.handle_async_request(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response
    finally:
        await transport.aclose()


def closed_port() -> int:
    """A loopback port that refuses connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.anyio
async def test_closed_port_is_connect_error() -> None:
    """A refused connection becomes httpx.ConnectError."""
    with pytest.raises(httpx.ConnectError):
        await send_once(f"http://127.0.0.1:{closed_port()}/")


@pytest.mark.anyio
async def test_hanging_server_is_read_timeout() -> None:
    """A server that never answers becomes httpx.ReadTimeout after the read timeout."""
    gate = asyncio.Event()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        await gate.wait()
        writer.close()

    async with server(hang) as url:
        timeout = {"connect": 1.0, "read": 0.05, "write": 1.0, "pool": 1.0}
        with pytest.raises(httpx.ReadTimeout):
            await send_once(url, timeout)
        gate.set()


@pytest.mark.anyio
async def test_close_without_response_is_remote_protocol_error() -> None:
    """A server that closes before answering becomes httpx.RemoteProtocolError."""

    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.close()

    async with server(close) as url:
        with pytest.raises(httpx.RemoteProtocolError):
            await send_once(url)


@pytest.mark.anyio
async def test_reset_is_read_or_protocol_error() -> None:
    """A TCP reset (RST) becomes httpx.ReadError or httpx.RemoteProtocolError."""

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()

    async with server(reset) as url:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            await send_once(url)


@pytest.mark.anyio
async def test_truncated_body_is_remote_protocol_error() -> None:
    """A body shorter than its Content-Length becomes httpx.RemoteProtocolError while reading."""

    async def short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-this")
        await writer.drain()
        writer.close()

    async with server(short) as url:
        with pytest.raises(httpx.RemoteProtocolError):
            await send_once(url)


@pytest.mark.anyio
async def test_garbage_status_line_is_remote_protocol_error() -> None:
    """A response that is not HTTP becomes httpx.RemoteProtocolError."""

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        writer.close()

    async with server(garbage) as url:
        with pytest.raises(httpx.RemoteProtocolError):
            await send_once(url)


@pytest.mark.anyio
async def test_request_has_no_added_headers_and_keeps_repeats() -> None:
    """On the wire: no User-Agent/Accept/Accept-Encoding added; repeated headers kept."""
    heads: list[bytes] = []

    async def capture(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await read_head(reader))
        writer.write(OK)
        await writer.drain()
        writer.close()

    async with server(capture) as url:
        transport = AiohttpTransport()
        request = httpx.Request("GET", url + "/p?a=%2F+b", headers=[("x-r", "1"), ("x-r", "2")])
        response = await transport.handle_async_request(request)
        await response.aread()
        await response.aclose()
        await transport.aclose()
    head = heads[0].lower()
    assert head.startswith(b"get /p?a=%2f+b http/1.1")
    assert b"x-r: 1\r\nx-r: 2" in head
    for name in (b"user-agent", b"accept:", b"accept-encoding"):
        assert name not in head
    assert response.headers.get_list("set-cookie") == ["a=1", "b=2"]


@pytest.mark.anyio
async def test_connection_is_reused_after_a_read_body() -> None:
    """Two sequential requests share one keep-alive connection."""
    keepalive = KeepAlive()
    async with server(keepalive) as url:
        transport = AiohttpTransport()
        for _ in range(2):
            response = await transport.handle_async_request(httpx.Request("GET", url))
            await response.aread()
            await response.aclose()
        await transport.aclose()
    assert keepalive.connections == 1


def test_make_transport_chooses_by_config() -> None:
    """make_transport gives an aiohttp transport (the lean one) by default, httpx's on request."""
    assert isinstance(make_transport(ProxyConfig()), AiohttpTransport)
    assert isinstance(make_transport(ProxyConfig(transport="httpx")), httpx.AsyncHTTPTransport)


def test_max_connections_must_be_positive() -> None:
    """A pool of zero connections is refused at construction."""
    with pytest.raises(ValueError, match="max_connections"):
        AiohttpTransport(max_connections=0)


def test_byte_fallback_pool_verifies_with_the_same_context() -> None:
    """The httpx pool used for non-UTF-8 header bytes verifies https with the same CA context."""
    import ssl

    from ballast_asgi.proxy.transports.aiohttp_transport import AiohttpTransport

    context = ssl.create_default_context()
    transport = AiohttpTransport(ssl_context=context)
    assert transport._bytes_transport()._pool._ssl_context is context


def test_a_deadline_bounds_the_exchange_without_a_per_read_timer() -> None:
    """With a deadline (``total``) no longer than the read bound, aiohttp gets no sock_read.

    The total fires first in every case, so the per-read timer (re-armed on each
    chunk) is redundant; the connect bounds stay.
    """
    t = client_timeout({"connect": 0.5, "read": 2.0, "write": 2.0, "pool": 2.0, "total": 2.0})
    assert (t.total, t.sock_read, t.connect, t.sock_connect) == (2.0, None, 2.5, 0.5)


def test_without_a_deadline_each_read_is_bounded() -> None:
    """No ``total``: ``read`` bounds each socket read, as httpx's read timeout does."""
    t = client_timeout({"connect": 0.5, "read": 30.0, "write": 30.0, "pool": 30.0})
    assert (t.total, t.sock_read, t.connect, t.sock_connect) == (None, 30.0, 30.5, 0.5)


async def _direct_get(url: str) -> tuple[AiohttpTransport, DirectResponse]:
    transport = AiohttpTransport()
    limits = client_timeout({"connect": 2.0, "read": 5.0, "write": 5.0, "pool": 5.0})
    response = await transport.send_direct("GET", URL(url + "/"), [], b"", limits)
    return transport, response


@pytest.mark.anyio
async def test_a_small_body_that_came_with_the_head_is_taken_at_once() -> None:
    """``arrived`` returns the whole body sent in the head's write; the connection is reused."""
    keepalive = KeepAlive()
    async with server(keepalive) as url:
        transport, response = await _direct_get(url)
        assert response.stream.arrived(2) == b"ok"  # parsed in the same read as the head
        assert response.stream.arrived(2) is None  # taken once
        await response.aclose()
        again = await transport.send_direct("GET", URL(url + "/"), [], b"", client_timeout({}))
        assert again.stream.arrived(3) is None  # a length that is not the body's
        assert [c async for c in again.stream] == [b"ok"]
        await again.aclose()
        await transport.aclose()
    assert keepalive.connections == 1


@pytest.mark.anyio
async def test_a_body_still_on_its_way_is_not_taken() -> None:
    """Until the whole body is in, ``arrived`` is None and the stream yields it as it comes."""
    more = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        await writer.drain()
        await more.wait()
        writer.write(b"cd")
        await writer.drain()
        writer.close()

    async with server(slow) as url:
        transport, response = await _direct_get(url)
        assert response.stream.arrived(4) is None
        more.set()
        assert b"".join([c async for c in response.stream]) == b"abcd"
        await response.aclose()
        await transport.aclose()


@pytest.mark.anyio
async def test_the_proxy_sends_a_body_that_came_with_the_head_as_one_message() -> None:
    """On the default transport a small whole body is one final message; the selector hears it."""

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(OK)
        await writer.drain()
        writer.close()

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async with server(once) as url:
        selector = BodyEnds(url)
        proxy = ProxyApp(selector=selector)
        scope = {"type": "http", "method": "GET", "path": "/", "raw_path": b"/",
                 "query_string": b"", "headers": [], "client": ("127.0.0.1", 1)}  # fmt: skip
        await proxy(scope, receive, send)
        await proxy.aclose()
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1] == {"type": "http.response.body", "body": b"ok", "more_body": False}
    assert selector.ends == [True]
