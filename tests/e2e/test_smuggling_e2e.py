"""Issue 27 on real sockets: request smuggling, stalled upgrades, duplicate Host, a huge head.

The gateway is the default stack (``build_gateway``) on uvicorn with the guarded
httptools protocol, as ``ballast`` runs it; the upstream is a real uvicorn app
that records every request it runs (or, where the bytes matter, a raw socket).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from ballast_asgi.config import build_config
from ballast_asgi.config.models import ServerConfig
from ballast_asgi.gateway import build_gateway
from ballast_asgi.server.serve import uvicorn_settings
from tests.e2e.raw_http import ScriptedUpstream, parse_responses, read_request
from tests.e2e.servers import serving

pytestmark = pytest.mark.e2e

TRANSPORTS = ["lean", "aiohttp", "httpx"]
SMUGGLED = b"GET /admin HTTP/1.1\r\nHost: evil.example\r\nX-Priority: critical\r\n\r\n"


class Origin:
    """A real uvicorn upstream app: records (method, path, host, body), answers with the path."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes, bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        host = dict(scope["headers"]).get(b"host", b"")
        self.seen.append((scope["method"], scope["path"], host, body))
        answer = scope["path"].encode()
        headers = [(b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def paths(self) -> list[str]:
        """The paths the upstream ran, in order."""
        return [path for _, path, _, _ in self.seen]


def _gateway(upstream_port: int, transport: str = "lean") -> Any:
    config = build_config(
        {
            "upstream": f"http://127.0.0.1:{upstream_port}",
            "proxy": {"transport": transport},
            "rate_limit": {"enabled": True, "rate_per_s": 1000, "burst": 1000},
        }
    )
    return build_gateway(config, env={})


@pytest.fixture
def origin() -> Iterator[tuple[Origin, int]]:
    """The recording uvicorn upstream and its port."""
    app = Origin()
    with serving(app, lifespan="off") as port:
        yield app, port


def _talk(port: int, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send ``data``; read until the server closes. A server that keeps the
    connection open past ``timeout_s`` fails the test (it would stall a client)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                pytest.fail(f"server kept the connection open; got {b''.join(chunks)[:200]!r}")
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def _serve_gateway(upstream_port: int, transport: str = "lean") -> Any:
    return serving(_gateway(upstream_port, transport), **uvicorn_settings(ServerConfig()))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_connection_content_length_smuggles_nothing(
    origin: tuple[Origin, int], transport: str
) -> None:
    """Issue 27.1: ``Connection: close, content-length`` cannot turn a body into a request."""
    app, up_port = origin
    attack = (
        b"POST /a HTTP/1.1\r\nHost: gw\r\nConnection: close, content-length\r\n"
        b"Content-Length: %d\r\n\r\n" % len(SMUGGLED)
    ) + SMUGGLED
    victim = b"GET /victim HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
    with _serve_gateway(up_port, transport) as port:
        (first,) = parse_responses(_talk(port, attack))
        (second,) = parse_responses(_talk(port, victim))
    assert (first.status, first.body) == (200, b"/a")
    assert (second.status, second.body) == (200, b"/victim")
    assert app.paths() == ["/a", "/victim"]
    assert app.seen[0][3] == SMUGGLED  # the body arrived as a body


@pytest.fixture
def recorder() -> Iterator[tuple[list[bytes], int]]:
    """A raw upstream that records each request's bytes (head + framed body) and answers 200."""
    seen: list[bytes] = []

    def script(conn: socket.socket, index: int) -> None:
        while request := read_request(conn):
            seen.append(request)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    up = ScriptedUpstream(script).start()
    try:
        yield seen, up.port
    finally:
        up.stop()


def _fields(request: bytes) -> list[tuple[bytes, bytes]]:
    lines = request.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
    return [(n.strip().lower(), v.strip()) for n, v in (line.split(b":", 1) for line in lines)]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("tokens", "body"),
    [
        (b"content-length", b"hello"),
        (b"transfer-encoding", b""),
        (b"host, x-forwarded-for, x-priority", b"hello"),
        (b"Content-Length , keep-alive", b"x" * 3000),
        (b"content-length", b"y" * 100_000),  # above request_buffer_bytes: streamed
    ],
)
def test_connection_tokens_never_remove_framing_or_routing(
    recorder: tuple[list[bytes], int], transport: str, tokens: bytes, body: bytes
) -> None:
    """The upstream gets the gateway's own framing, Host and X-Forwarded-*, whatever is named."""
    seen, up_port = recorder
    request = (
        b"POST /t HTTP/1.1\r\nHost: gw\r\nX-Priority: bulk\r\nConnection: close, "
        + tokens
        + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )
    with _serve_gateway(up_port, transport) as port:
        (response,) = parse_responses(_talk(port, request))
    assert response.status == 200
    (forwarded,) = seen
    fields = dict(_fields(forwarded))
    assert fields[b"content-length"] == str(len(body)).encode()
    assert fields[b"x-forwarded-host"] == b"gw" and b"host" in fields
    assert fields[b"x-priority"] == b"bulk" and fields[b"x-forwarded-for"] == b"127.0.0.1"
    assert forwarded.endswith(b"\r\n\r\n" + body)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /u HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: foo\r\n"
        b"Content-Length: 5\r\n\r\nhello",
        b"POST /u HTTP/1.1\r\nHost: gw\r\nConnection: upgrade\r\nUpgrade: h2c\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"CONNECT /c HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n\r\nhello",
        b"CONNECT /c HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1:80\r\nContent-Length: 5\r\n\r\nhello",
        b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
    ],
)
def test_upgrades_with_a_body_and_connect_are_answered_at_once(
    origin: tuple[Origin, int], request_bytes: bytes
) -> None:
    """Issue 27.2: refused (400/405) and closed at once, nothing upstream; the next is served."""
    app, up_port = origin
    with _serve_gateway(up_port) as port:
        refusals = [parse_responses(_talk(port, request_bytes))[0] for _ in range(40)]
        after = parse_responses(
            _talk(port, b"GET /next HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        )
    expected = 405 if request_bytes.startswith(b"CONNECT") else 400
    assert {r.status for r in refusals} == {expected}
    assert all(r.header(b"connection") == [b"close"] for r in refusals)
    assert after[0].status == 200 and app.paths() == ["/next"]


def test_a_bodyless_upgrade_is_served_and_its_connection_closed(
    origin: tuple[Origin, int],
) -> None:
    """A GET asking for h2c is answered as plain HTTP; the server then closes (reads no more)."""
    app, up_port = origin
    request = (
        b"GET /h HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    )
    with _serve_gateway(up_port) as port:
        (response,) = parse_responses(_talk(port, request))
    assert (response.status, response.body) == (200, b"/h")
    assert response.header(b"connection") == [b"close"]
    assert app.paths() == ["/h"]


@pytest.mark.parametrize("second", [b"evil.example", b"gw"])
def test_a_duplicate_host_gets_400_and_reaches_nothing(
    origin: tuple[Origin, int], second: bytes
) -> None:
    """Issue 27.7: two Host fields (even equal ones) are a 400, as RFC 9112 and nginx."""
    app, up_port = origin
    request = b"GET /d HTTP/1.1\r\nHost: gw\r\nHost: " + second + b"\r\nConnection: close\r\n\r\n"
    with _serve_gateway(up_port) as port:
        (response,) = parse_responses(_talk(port, request))
    assert response.status == 400 and b"Host" in response.body
    assert app.seen == []


def test_a_head_far_over_the_limit_still_reads_its_431(origin: tuple[Origin, int]) -> None:
    """Issue 27.7: a client that sends 64 MB of head, then reads, gets its 431 (no reset).

    As curl or httpx do: the whole request is written before the answer is read.
    Without a lingering close the server resets the connection while the
    client is still writing, and the client sees a send error, not the 431.
    """
    _, up_port = origin
    head = b"GET / HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"a" * (64 << 20)
    with _serve_gateway(up_port) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(15)
        sock.sendall(head)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 431 "), received[:100]


def _send_all_then_read(port: int, data: bytes) -> bytes:
    """Write all of ``data`` (as curl does), then read the answer to EOF."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(15)
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /big HTTP/1.1\r\nHost: gw\r\nContent-Length: 104857600\r\n\r\n", 413),
        (
            b"POST /bad HTTP/1.1\r\nHost: gw\r\nX-Bad\x01: v\r\nContent-Length: 104857600\r\n\r\n",
            400,
        ),
    ],
)
def test_an_early_refusal_is_read_by_a_client_still_sending_its_body(
    origin: tuple[Origin, int], head: bytes, status: int
) -> None:
    """A 413 from the stack or uvicorn's 400, answered before 64 MB of body: read, not reset."""
    _, up_port = origin
    with _serve_gateway(up_port) as port:
        received = _send_all_then_read(port, head + b"z" * (64 << 20))
    assert received.startswith(b"HTTP/1.1 %d " % status), received[:100]
