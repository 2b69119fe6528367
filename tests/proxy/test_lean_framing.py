"""The lean transport's framing and pooling against a raw upstream on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gc

import pytest

from ballast_asgi.config import ProxyConfig
from ballast_asgi.proxy.transports import make_transport
from ballast_asgi.proxy.transports.lean import LeanTransport, request_head
from ballast_asgi.proxy.transports.lean_wire import HIGH_WATER_BYTES, Conn, LeanResponse
from ballast_asgi.proxy.upstream import Upstream
from tests.lean_support import Raw, answering, body_of, get, raw_upstream

CL = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.mark.anyio
async def test_content_length_body_and_raw_headers_as_sent() -> None:
    """Order, repeats and case of header names kept; values lose trailing blanks; body whole."""
    answer = (b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-Odd:  v \t\r\nset-cookie: b=2\r\n"
              b"Content-Length: 5\r\n\r\nhello")  # fmt: skip
    async with raw_upstream(answering(answer)) as (_raw, up):
        transport = LeanTransport()
        response = await get(transport, up)
        assert response.status_code == 200
        assert response.raw_headers == [
            (b"Set-Cookie", b"a=1"), (b"X-Odd", b"v"), (b"set-cookie", b"b=2"),
            (b"Content-Length", b"5"),
        ]  # fmt: skip
        assert response.stream.arrived(5) == b"hello"
        await response.aclose()
        await transport.aclose()


@pytest.mark.anyio
async def test_request_goes_as_one_write_with_nothing_added() -> None:
    """Request line, the given headers and the body, byte for byte; nothing else added."""
    async with raw_upstream(answering(CL)) as (raw, up):
        transport = LeanTransport()
        response = await get(transport, up, "POST", body=b"", headers=[(b"X-R", b"caf\xe9")])
        await body_of(response)
        await transport.aclose()
    assert raw.heads == [
        b"POST /p?q=1 HTTP/1.1\r\nhost: " + up.netloc + b"\r\nX-R: caf\xe9\r\n\r\n"
    ]


def test_a_header_with_a_line_break_is_not_sent_lean() -> None:
    """CR or LF in a name or value: no lean request (the aiohttp path refuses or carries it)."""
    up = Upstream.parse("http://127.0.0.1:1/base")
    assert request_head("GET", up, b"/x", [(b"a", b"1")]) == b"GET /base/x HTTP/1.1\r\na: 1\r\n\r\n"
    assert request_head("GET", up, b"?q", []) == b"GET /base?q HTTP/1.1\r\n\r\n"
    assert request_head("GET", up, b"/x", [(b"a", b"1\r\nb: 2")]) is None
    assert request_head("GET", up, b"/x", [(b"a\n", b"1")]) is None
    assert request_head("GET", up, b"*", []) is None
    https = Upstream.parse("https://127.0.0.1:1")
    assert LeanTransport().send_lean("GET", https, b"/", [], b"", None) is None  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_chunked_body_is_decoded_trailers_dropped_and_connection_reused() -> None:
    """Chunk payloads only reach the reader; the connection serves the next request."""
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n")  # fmt: skip
    async with raw_upstream(answering(chunked, CL)) as (raw, up):
        transport = LeanTransport()
        response = await get(transport, up)
        assert (b"Transfer-Encoding", b"chunked") in response.raw_headers
        assert b"X-Trailer" not in [name for name, _ in response.raw_headers]
        assert await body_of(response) == b"abcde"
        assert await body_of(await get(transport, up)) == b"ok"
        await transport.aclose()
    assert raw.connections == 1


@pytest.mark.anyio
async def test_close_delimited_body_ends_at_eof_and_is_not_reused() -> None:
    """No Content-Length, not chunked: the body is what came before EOF; next request reconnects."""

    async def close_delimited(
        raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await raw.head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil-")
        await writer.drain()
        writer.write(b"eof")

    async with raw_upstream(close_delimited) as (raw, up):
        transport = LeanTransport()
        assert await body_of(await get(transport, up)) == b"until-eof"
        assert await body_of(await get(transport, up)) == b"until-eof"
        await transport.aclose()
    assert raw.connections == 2


@pytest.mark.anyio
async def test_head_has_no_body_and_its_connection_is_not_reused() -> None:
    """HEAD: the head's Content-Length announces nothing to read; the connection is closed."""
    head_answer = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"
    async with raw_upstream(answering(head_answer, CL)) as (raw, up):
        transport = LeanTransport()
        response = await get(transport, up, "HEAD")
        assert (response.status_code, await body_of(response)) == (200, b"")
        assert await body_of(await get(transport, up)) == b"ok"
        await transport.aclose()
    assert raw.connections == 2


@pytest.mark.anyio
@pytest.mark.parametrize("status", [204, 304])
async def test_no_body_statuses_complete_at_the_head_and_are_reused(status: int) -> None:
    """204 and 304 carry no body whatever they say; the connection is reused."""
    bodiless = b"HTTP/1.1 %d X\r\nContent-Length: 4\r\n\r\n" % status
    async with raw_upstream(answering(bodiless, CL)) as (raw, up):
        transport = LeanTransport()
        response = await get(transport, up)
        assert (response.status_code, await body_of(response)) == (status, b"")
        assert await body_of(await get(transport, up)) == b"ok"
        await transport.aclose()
    assert raw.connections == 1


@pytest.mark.anyio
async def test_interim_responses_are_skipped() -> None:
    """100 and 103 before the final response are not the response."""
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nLink: </a>\r\n\r\n" + CL
    async with raw_upstream(answering(answer)) as (_raw, up):
        transport = LeanTransport()
        response = await get(transport, up)
        assert (response.status_code, response.raw_headers) == (200, [(b"Content-Length", b"2")])
        assert await body_of(response) == b"ok"
        await transport.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "answer",
    [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
     b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
     CL + b"HTTP/1.1 500 Other\r\nX-Other: 1\r\n\r\n"],
)  # fmt: skip
async def test_close_http10_and_trailing_bytes_are_not_reused(answer: bytes) -> None:
    """``Connection: close``, HTTP/1.0, or more bytes after the response: a new connection next."""
    async with raw_upstream(answering(answer, CL)) as (raw, up):
        transport = LeanTransport()
        for _ in range(2):
            response = await get(transport, up)
            assert (response.status_code, await body_of(response)) == (200, b"ok")
            assert b"X-Other" not in [name for name, _ in response.raw_headers]
        await transport.aclose()
    assert raw.connections == 2


@pytest.mark.anyio
async def test_a_body_not_read_to_the_end_closes_the_connection() -> None:
    """``aclose`` before the end: the connection is closed, never pooled with bytes pending."""
    partial = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"
    async with raw_upstream(answering(partial, CL)) as (raw, up):
        transport = LeanTransport()
        response = await get(transport, up)
        await response.aclose()
        assert transport._pool.in_use == 0 and transport._pool.idle_count == 0
        assert await body_of(await get(transport, up)) == b"ok"
        await transport.aclose()
    assert raw.connections == 2


@pytest.mark.anyio
async def test_an_expired_idle_connection_is_not_taken() -> None:
    """A connection idle for ``keepalive_s`` is closed instead of reused."""
    async with raw_upstream(answering(CL, CL)) as (raw, up):
        transport = LeanTransport(keepalive_s=5.0)
        assert await body_of(await get(transport, up)) == b"ok"
        (conn,) = transport._pool.idle[(up.host, up.port)]
        conn.idle_since -= 5.0  # as if 5 s had passed
        assert await body_of(await get(transport, up)) == b"ok"
        assert conn.closed
        await transport.aclose()
    assert raw.connections == 2


@pytest.mark.anyio
async def test_a_large_body_pauses_reading_until_the_consumer_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Backpressure: past the high-water mark the socket is not read; all bytes arrive in order."""
    paused = asyncio.Event()
    pause = Conn.pause

    def watched(conn: Conn, on: bool) -> None:
        pause(conn, on)
        if on:
            paused.set()

    monkeypatch.setattr(Conn, "pause", watched)
    size = 4 * 1024 * 1024
    payload = bytes(range(256)) * (size // 256)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + payload
    async with raw_upstream(answering(answer)) as (_raw, up):
        transport = LeanTransport()
        response = await get(transport, up)
        await paused.wait()  # the upstream wrote more than the lean buffer holds
        assert HIGH_WATER_BYTES < response._size < size  # type: ignore[attr-defined]
        assert await body_of(response) == payload
        await transport.aclose()


def test_lean_is_the_default_transport_and_selectable() -> None:
    """``proxy.transport``: lean by default, aiohttp and httpx on request."""
    assert type(make_transport(ProxyConfig())) is LeanTransport
    assert type(make_transport(ProxyConfig(transport="lean"))) is LeanTransport
    assert type(make_transport(ProxyConfig(transport="aiohttp"))) is not LeanTransport


@pytest.mark.anyio
async def test_a_full_pool_queues_the_next_request_until_a_connection_is_free() -> None:
    """``max_connections`` reached: the next request waits, then takes the freed connection."""
    rest = asyncio.Event()

    async def split(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        await rest.wait()
        writer.write(b"cd")
        await raw.head(reader)
        writer.write(CL)
        await reader.read()

    async with raw_upstream(split) as (raw, up):
        transport = LeanTransport(max_connections=1)
        first = await get(transport, up)
        second = asyncio.ensure_future(get(transport, up))
        await asyncio.sleep(0)
        assert not second.done() and transport._pool.in_use == 1
        rest.set()
        assert await body_of(first) == b"abcd"
        assert await body_of(await second) == b"ok"
        await transport.aclose()
    assert raw.connections == 1


@pytest.mark.anyio
async def test_a_finished_exchange_leaves_no_garbage_cycle() -> None:
    """With the collector off, a read response is freed by reference counting alone."""
    async with raw_upstream(answering(CL, CL)) as (_raw, up):
        transport = LeanTransport()
        gc.collect()
        gc.disable()
        try:
            for _ in range(2):
                response = await get(transport, up)
                assert response.stream.arrived(2) == b"ok"
                await response.aclose()
            del response
            assert not [o for o in gc.get_objects() if isinstance(o, LeanResponse)]
        finally:
            gc.enable()
        await transport.aclose()
