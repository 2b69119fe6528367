"""The server under the gateway, on raw sockets: head size and time caps, connection cap.

Also pins what plain uvicorn does (the reason for ``ballast_asgi.server.serve``):
httptools passes a 1 MB header to the app; h11 stops at 16 KiB.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from ballast_asgi.config.models import ServerConfig
from ballast_asgi.server.serve import uvicorn_settings
from tests.e2e.raw import exchange, status_of
from tests.e2e.servers import serving

pytestmark = pytest.mark.e2e


class App:
    """Counts requests; answers 200 with the body length (no lifespan)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.calls += 1
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(size).encode()})


def _guarded(**server: Any) -> dict[str, Any]:
    return uvicorn_settings(ServerConfig(**server))


def _big_header(size: int) -> bytes:
    return b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\nConnection: close\r\n\r\n"


def test_plain_httptools_passes_a_huge_header_to_the_app() -> None:
    """Pinned uvicorn behaviour: httptools has no head limit (so the guard is needed)."""
    app = App()
    with serving(app, http="httptools") as port:
        assert status_of(exchange(port, _big_header(1_000_000))) == 200
    assert app.calls == 1


def test_plain_h11_refuses_only_heads_still_incomplete_over_16_kib() -> None:
    """Pinned uvicorn behaviour: h11's 16 KiB cap applies to a head still incomplete.

    A 1 MB head is refused; a 20 KB head that arrives in one read is accepted.
    """
    app = App()
    with serving(app, http="h11") as port:
        assert status_of(exchange(port, _big_header(1_000_000))) in (400, 431)
        assert status_of(exchange(port, _big_header(20_000))) == 200
    assert app.calls == 1


def test_guard_refuses_a_huge_head_with_431() -> None:
    """Above max_header_bytes: 431 and close, before the app is called."""
    app = App()
    with serving(app, **_guarded(max_header_bytes=16_384)) as port:
        assert status_of(exchange(port, _big_header(1_000_000))) == 431
        assert status_of(exchange(port, _big_header(10_000))) == 200
    assert app.calls == 1


def test_guard_does_not_count_the_body() -> None:
    """A 1 MB body sent in one write with a small head is served (head bytes only)."""
    app = App()
    body = b"x" * 1_000_000
    head = b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
    with serving(app, **_guarded(max_header_bytes=4096)) as port:
        response = exchange(port, head % len(body) + body)
    assert status_of(response) == 200 and b"\r\n1000000\r\n" in response


def test_guard_closes_a_slow_head_with_408() -> None:
    """A head that does not complete within header_timeout_ms: 408 and close."""
    with serving(App(), **_guarded(header_timeout_ms=300)) as port:
        started = time.monotonic()
        response = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        elapsed = time.monotonic() - started
    assert status_of(response) == 408
    assert 0.25 <= elapsed < 3.0


def test_guard_closes_a_silent_connection() -> None:
    """A connection that never sends a byte is closed after header_timeout_ms."""
    with serving(App(), **_guarded(header_timeout_ms=300)) as port:
        assert exchange(port, b"") == b""


def test_keep_alive_then_slow_second_head_is_closed() -> None:
    """After one full request, a trickled second head is still bounded."""
    first = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    with serving(App(), **_guarded(header_timeout_ms=300, keep_alive_ms=5000)) as port:
        response = exchange(port, first + b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow")
    assert response.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in response


def test_connection_cap_answers_503() -> None:
    """Beyond server.max_connections open connections, requests get 503 from the server."""
    app = App()
    with serving(app, **_guarded(max_connections=2)) as port:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            time.sleep(0.1)  # let the server register both connections (not a correctness wait)
            response = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        finally:
            for sock in idle:
                sock.close()
    assert status_of(response) == 503 and app.calls == 0
