"""The lean HTTP/1.1 client: response framing, request bytes, and a real server."""

from __future__ import annotations

import asyncio

import pytest

from ballast_tools.loadgen.lean import LeanPool, _Response, request_prefix
from ballast_tools.loadgen.runner import LoadConfig, LoadRunner


def _feed(*parts: bytes) -> tuple[_Response, list[bool]]:
    r = _Response()
    return r, [r.feed(p) for p in parts]


def test_content_length_body_completes_only_when_all_bytes_arrived() -> None:
    """A response is complete when Content-Length bytes of body have been read."""
    r, done = _feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", b"cde")
    assert done == [False, True] and r.status == 200 and r.reason is None


def test_head_split_across_reads_and_shed_reason_is_read() -> None:
    """The head may arrive in pieces; X-Ballast-Reason is taken from it."""
    r, done = _feed(b"HTTP/1.1 429 Too Many\r\nX-Ballast-Rea", b"son: queue_full\r\n", b"\r\n")
    assert done == [False, False, False]  # no Content-Length: body runs until close
    assert r.status == 429 and r.reason == "queue_full" and r.remaining == -1


def test_chunked_body_with_extension_and_trailers() -> None:
    """Chunked framing: sizes in hex, chunk extensions ignored, the final chunk ends it."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    _, done = _feed(head + b"3;x=1\r\nabc\r\n", b"a\r\n0123456789\r\n0\r\n", b"\r\n")
    assert done == [False, False, True]


def test_no_body_statuses_and_connection_close() -> None:
    """204 has no body whatever the headers say; Connection: close is noted."""
    r, done = _feed(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
    assert done == [True] and r.close


def test_request_prefix_names_host_path_and_query() -> None:
    """The prebuilt request line keeps the path and query; a POST says Content-Length: 0."""
    host, port, head = request_prefix("http://127.0.0.1:8080/a/b?x=1", "POST")
    assert (host, port) == ("127.0.0.1", 8080)
    assert head.startswith(b"POST /a/b?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n")
    assert b"Content-Length: 0\r\n" in head


def test_https_is_refused_with_a_clear_error() -> None:
    """The lean client speaks plain HTTP only; the message says so."""
    with pytest.raises(ValueError, match="http://"):
        LoadRunner(LoadConfig(target="https://example.org/", rate_rps=1, duration_s=1))


def test_unknown_client_is_a_validation_error() -> None:
    """``client`` names one of the two clients."""
    with pytest.raises(ValueError, match="client must be one of"):
        LoadConfig(target="http://127.0.0.1:1/", rate_rps=1, duration_s=1, client="curl")


async def _serve(handler: asyncio.Protocol) -> tuple[asyncio.Server, int]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


class _Silent(asyncio.Protocol):
    """Accepts and never answers."""


class _Answer(asyncio.Protocol):
    """Answers every request with a fixed response."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_pool_reuses_one_connection_for_sequential_requests() -> None:
    """Requests one after another travel on one keep-alive connection."""
    server, port = await _serve(_Answer())
    results: list[tuple[int, int, str | None, str]] = []
    got = asyncio.Event()

    def done(slot: int, status: int, reason: str | None, detail: str) -> None:
        results.append((slot, status, reason, detail))
        got.set()

    pool = LeanPool("127.0.0.1", port, done)
    for slot in range(3):
        got.clear()
        pool.send(slot, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 5.0)
        await got.wait()
    assert results == [(0, 200, None, ""), (1, 200, None, ""), (2, 200, None, "")]
    assert len(pool.conns) == 1
    await pool.close()
    server.close()


@pytest.mark.anyio
async def test_a_silent_server_ends_the_request_as_a_timeout() -> None:
    """The per-request timer ends an unanswered request with ``timeout`` and drops the socket."""
    server, port = await _serve(_Silent())
    results: list[str] = []
    got = asyncio.Event()

    def done(slot: int, status: int, reason: str | None, detail: str) -> None:
        results.append(detail)
        got.set()

    pool = LeanPool("127.0.0.1", port, done)
    pool.send(0, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0.05)
    await got.wait()
    assert results == ["timeout"] and not pool.idle
    await pool.close()
    server.close()
