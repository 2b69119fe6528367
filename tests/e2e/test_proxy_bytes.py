"""Issue 13.2/13.3/13.7 on real sockets: header bytes both ways, nothing added, XFF, redirects."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ballast_asgi.config import ProxyConfig
from ballast_asgi.proxy.app import ProxyApp
from tests.e2e.raw_http import ScriptedUpstream, exchange, parse_responses, read_request
from tests.e2e.support import thread_servers, uvicorn_gateway

pytestmark = pytest.mark.e2e

TRANSPORTS = ["lean", "aiohttp", "httpx"]


@pytest.fixture
def serve() -> Iterator[Any]:
    """Serve ASGI apps on uvicorn threads (lifespan on); stop them at teardown."""
    with thread_servers() as start:
        yield start


class Recorder:
    """A raw upstream that records each request's bytes and answers with ``answer``."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.seen: list[bytes] = []
        self.up = ScriptedUpstream(self._script).start()

    def _script(self, conn: socket.socket, index: int) -> None:
        while True:
            request = read_request(conn)
            if not request:
                return
            self.seen.append(request)
            conn.sendall(self.answer)

    def head(self, i: int = 0) -> list[tuple[bytes, bytes]]:
        """Request ``i``'s header fields as raw (name, value) pairs."""
        lines = self.seen[i].split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
        return [(n.lower(), v.strip()) for n, v in (line.split(b":", 1) for line in lines)]


@pytest.fixture
def recorder() -> Iterator[Any]:
    """Start Recorders; stop them at teardown."""
    made: list[Recorder] = []

    def make(answer: bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok") -> Recorder:
        made.append(Recorder(answer))
        return made[-1]

    yield make
    for r in made:
        r.up.stop()


def _proxy(rec: Recorder, transport: str) -> ProxyApp:
    config = ProxyConfig.model_validate({"transport": transport})
    return ProxyApp(f"http://127.0.0.1:{rec.up.port}", config=config)


def _send(port: int, head: bytes, body: bytes = b"") -> bytes:
    return exchange(port, head + b"Connection: close\r\n\r\n" + body)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_header_values_forwarded_byte_for_byte(serve: Any, recorder: Any, transport: str) -> None:
    """Latin-1 and UTF-8 header bytes reach the upstream unchanged (no re-encoding)."""
    rec = recorder()
    port = serve(_proxy(rec, transport))
    raw = _send(port, b"GET /h HTTP/1.1\r\nHost: gw\r\nX-Latin1: caf\xe9\r\nX-Utf8: caf\xc3\xa9\r\n"
                      b"X-Ctl: a\tb\r\n")  # fmt: skip
    assert parse_responses(raw)[0].status == 200
    head = rec.head()
    assert (b"x-latin1", b"caf\xe9") in head
    assert (b"x-utf8", b"caf\xc3\xa9") in head
    assert (b"x-ctl", b"a\tb") in head


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_response_header_bytes_come_back_unchanged(
    serve: Any, recorder: Any, transport: str
) -> None:
    """A non-ASCII response header value reaches the client as the upstream sent it."""
    rec = recorder(b"HTTP/1.1 200 OK\r\nX-Resp: caf\xe9\r\nX-U: \xe2\x9c\x93\r\n"
                   b"content-length: 0\r\n\r\n")  # fmt: skip
    port = serve(_proxy(rec, transport))
    (response,) = parse_responses(_send(port, b"GET /r HTTP/1.1\r\nHost: gw\r\n"))
    assert response.header(b"x-resp") == [b"caf\xe9"]
    assert response.header(b"x-u") == [b"\xe2\x9c\x93"]


FORWARDED = {b"host", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host"}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("request_head", "body"),
    [
        (b"POST /p HTTP/1.1\r\nHost: gw\r\n", b""),
        (b"DELETE /d HTTP/1.1\r\nHost: gw\r\n", b""),
        (b"PUT /u HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\n", b"abc"),
        (b"POST /z HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n", b""),
        (b"OPTIONS /o HTTP/1.1\r\nHost: gw\r\nAccept: */*\r\n", b""),
    ],
)
def test_nothing_added_that_the_client_did_not_send(
    serve: Any, recorder: Any, transport: str, request_head: bytes, body: bytes
) -> None:
    """The upstream gets the client's headers plus Host and X-Forwarded-* only."""
    rec = recorder()
    port = serve(_proxy(rec, transport))
    assert parse_responses(_send(port, request_head, body))[0].status == 200
    sent = {line.split(b":", 1)[0].lower() for line in request_head.split(b"\r\n")[1:] if line}
    got = {name for name, _ in rec.head()}
    assert got - sent <= FORWARDED, got - sent
    assert rec.seen[0].endswith(b"\r\n\r\n" + body)


def test_xff_gets_exactly_the_direct_peer_appended(tmp_path: Path, recorder: Any) -> None:
    """Through ``uvicorn ballast_asgi.gateway:app``: a forged XFF is kept, the peer appended."""
    rec = recorder()
    config = tmp_path / "gw.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{rec.up.port}\n")
    with uvicorn_gateway(config) as (base, _pid):
        port = int(base.rsplit(":", 1)[1])
        raw = _send(port, b"GET /x HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: 203.0.113.9\r\n")
    assert parse_responses(raw)[0].status == 200
    assert [v for n, v in rec.head() if n == b"x-forwarded-for"] == [b"203.0.113.9, 127.0.0.1"]


def test_redirect_location_points_at_the_gateway(serve: Any, recorder: Any) -> None:
    """An upstream redirect to its own origin and base path is rewritten to the gateway's."""
    rec = recorder(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{port}/base/next?q=1\r\n"
                   b"content-length: 0\r\n\r\n")  # fmt: skip
    rec.answer = rec.answer.replace(b"{port}", str(rec.up.port).encode())
    port = serve(ProxyApp(f"http://127.0.0.1:{rec.up.port}/base"))
    (response,) = parse_responses(_send(port, b"GET /start HTTP/1.1\r\nHost: gw.example:8443\r\n"))
    assert response.status == 302
    assert response.header(b"location") == [b"http://gw.example:8443/next?q=1"]
    assert (b"host", f"127.0.0.1:{rec.up.port}".encode()) in rec.head()


def test_preserve_host_sends_the_clients_host(serve: Any, recorder: Any) -> None:
    """With proxy.preserve_host the upstream sees the client's Host and nothing is rewritten."""
    rec = recorder(b"HTTP/1.1 302 Found\r\nLocation: http://gw.example/next\r\n"
                   b"content-length: 0\r\n\r\n")  # fmt: skip
    app = ProxyApp(f"http://127.0.0.1:{rec.up.port}", config=ProxyConfig(preserve_host=True))
    port = serve(app)
    (response,) = parse_responses(_send(port, b"GET /s HTTP/1.1\r\nHost: gw.example\r\n"))
    assert response.header(b"location") == [b"http://gw.example/next"]
    assert (b"host", b"gw.example") in rec.head()
