"""Proxy conformance (issue 13, deliver 7): the same requests direct and through the gateway.

A local httpbin-like upstream (``tests/conformance_upstream.py``) runs on
uvicorn; ``uvicorn ballast_asgi.gateway:app`` (default config) runs in front of
it. Each row of the table is sent over a raw socket to both, and the answers
are compared byte for byte: status, header list (names and values, in order)
and body. Allowed differences, and only these: ``Date``/``Server`` (checked
separately: exactly one each through the gateway), the connection framing
headers (``Connection``, ``Keep-Alive``, ``Transfer-Encoding``), the
redirect target's host (the client's own in both cases), and, in echoed
requests, ``Host`` and ``X-Forwarded-*``.

Time to first byte of an endless server-sent-event stream and of a slow body,
for GET and POST, is measured through the gateway. Websocket rows: the echo
through the gateway is covered by ``tests/e2e/test_websocket_e2e.py`` (the
``ops`` websocket proxy); add websocket rows to ``WEBSOCKET_ROWS`` here when
they should be compared against this upstream too.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import conformance_upstream
from tests.e2e.raw_http import RawResponse, exchange, parse_responses
from tests.e2e.support import free_port, serve_in_thread, stop_thread, uvicorn_gateway

pytestmark = pytest.mark.e2e

BIG = conformance_upstream.payload(5 * 1024 * 1024)
FRAMING = {b"date", b"server", b"connection", b"keep-alive", b"transfer-encoding"}
FORWARDED = {"host", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "connection"}

#: (id, method, target, extra header lines, body, chunked upload)
ROWS: list[tuple[str, bytes, bytes, list[bytes], bytes, bool]] = [
    ("get-query", b"GET", b"/anything?a=1&b=%2F+x&c=%E2%9C%93", [], b"", False),
    ("encoded-path", b"GET", b"/anything/%2Fenc/caf%C3%A9;p?x=%25", [], b"", False),
    ("repeated-headers", b"GET", b"/anything", [b"X-Rep: 1", b"X-Rep: 2"], b"", False),
    ("latin1-utf8-request-headers", b"GET", b"/anything",
     [b"X-Latin1: caf\xe9", b"X-Utf8: caf\xc3\xa9"], b"", False),
    ("post-json", b"POST", b"/anything", [b"Content-Type: application/json"], b'{"a": 1}', False),
    ("post-bodiless", b"POST", b"/anything", [], b"", False),
    ("post-length-0", b"POST", b"/anything", [b"Content-Length: 0"], b"", False),
    ("delete", b"DELETE", b"/anything", [], b"", False),
    ("options", b"OPTIONS", b"/anything", [b"Accept: */*"], b"", False),
    ("patch", b"PATCH", b"/anything", [b"Content-Type: text/plain"], b"patch me", False),
    ("put-5mb", b"PUT", b"/anything", [], BIG, False),
    ("post-chunked", b"POST", b"/anything", [], b"chunked upload body " * 5000, True),
    ("status-418", b"GET", b"/status/418", [], b"", False),
    ("status-204", b"GET", b"/status/204", [], b"", False),
    ("status-500", b"GET", b"/status/500", [], b"", False),
    ("redirect-relative", b"GET", b"/redirect", [], b"", False),
    ("redirect-absolute", b"GET", b"/absolute", [], b"", False),
    ("cookies", b"GET", b"/cookies", [], b"", False),
    ("gzip", b"GET", b"/gzip", [b"Accept-Encoding: gzip"], b"", False),
    ("bytes-5mb", b"GET", b"/bytes/5242880", [], b"", False),
    ("chunked-response", b"GET", b"/stream/300000", [], b"", False),
    ("head", b"HEAD", b"/bytes/1000", [], b"", False),
    ("etag-304", b"GET", b"/etag/v1", [b'If-None-Match: "v1"'], b"", False),
    ("etag-200", b"GET", b"/etag/v1", [b'If-None-Match: "v0"'], b"", False),
    ("latin1-response-headers", b"GET", b"/latin", [], b"", False),
]  # fmt: skip

#: Websocket rows go here (compared against ``conformance_upstream``'s echo).
WEBSOCKET_ROWS: list[Any] = []


#: Extra gateway config for the stream test: none. The retry stage decides at the
#: response head, so the default gateway streams (retries stay on).
STREAM_CONFIG = ""


@pytest.fixture(scope="module")
def upstream_port() -> Iterator[int]:
    """The httpbin-like upstream on uvicorn, for the whole module; it stops when asked (no
    stream the tests left is still running)."""
    port = free_port()
    server, thread = serve_in_thread(conformance_upstream.app, port)
    try:
        yield port
    finally:
        stop_thread(server, thread)
        assert not thread.is_alive(), "the upstream did not stop: a stream outlived its client"


def _gateway(tmp: Path, upstream: int, extra: str) -> Any:
    config = tmp / "gw.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{upstream}\n{extra}")
    return uvicorn_gateway(config)


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, upstream_port: int
) -> Iterator[dict[str, int]]:
    """The upstream and the gateway (default config) for the whole module."""
    with _gateway(tmp_path_factory.mktemp("conf"), upstream_port, "") as (base, _pid):
        yield {"upstream": upstream_port, "gateway": int(base.rsplit(":", 1)[1])}


@pytest.fixture(scope="module")
def stream_servers(
    tmp_path_factory: pytest.TempPathFactory, upstream_port: int
) -> Iterator[dict[str, int]]:
    """The upstream and a gateway with ``STREAM_CONFIG``."""
    tmp = tmp_path_factory.mktemp("stream")
    with _gateway(tmp, upstream_port, STREAM_CONFIG) as (base, _pid):
        yield {"upstream": upstream_port, "gateway": int(base.rsplit(":", 1)[1])}


def _request(port: int, method: bytes, target: bytes, extra: list[bytes], body: bytes,
             chunked: bool) -> bytes:  # fmt: skip
    lines = [method + b" " + target + b" HTTP/1.1", f"Host: 127.0.0.1:{port}".encode(), *extra]
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
        framed = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 4096]), body[i : i + 4096])
                          for i in range(0, len(body), 4096)) + b"0\r\n\r\n"  # fmt: skip
    else:
        if body:
            lines.append(f"Content-Length: {len(body)}".encode())
        framed = body
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + framed


def _fetch(port: int, row: tuple[str, bytes, bytes, list[bytes], bytes, bool]) -> RawResponse:
    _, method, target, extra, body, chunked = row
    raw = exchange(port, _request(port, method, target, extra, body, chunked), timeout_s=30)
    (response,) = parse_responses(raw, head_only=method == b"HEAD")
    assert response.complete
    return response


def _normal(response: RawResponse, port: int) -> tuple[int, list[tuple[bytes, bytes]], Any]:
    host = f"127.0.0.1:{port}".encode()
    headers = [(n.lower(), v.replace(host, b"{HOST}")) for n, v in response.headers
               if n.lower() not in FRAMING]  # fmt: skip
    body: Any = response.body
    if response.header(b"content-type") == [b"application/json"]:
        doc = json.loads(body)
        doc["headers"] = [h for h in doc["headers"] if h[0] not in FORWARDED]
        doc["body"] = base64.b64decode(doc["body"])
        body = doc
        headers = [(n, v) for n, v in headers if n != b"content-length"]  # echo length differs
    return response.status, headers, body


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_direct_and_through_the_gateway_agree(servers: dict[str, int], row: Any) -> None:
    """Status, headers and body through the gateway equal the direct answer."""
    direct = _fetch(servers["upstream"], row)
    proxied = _fetch(servers["gateway"], row)
    assert _normal(proxied, servers["gateway"]) == _normal(direct, servers["upstream"])
    assert len(proxied.header(b"date")) == 1 and len(proxied.header(b"server")) == 1


def _first_byte_s(port: int, method: bytes, path: bytes) -> tuple[float, bytes]:
    """Seconds until the first body byte arrives, and that first piece of body."""
    request = _request(port, method, path, [], b"x" if method == b"POST" else b"", False)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or not data.split(b"\r\n\r\n", 1)[1]:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        return time.monotonic() - started, data.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("method", [b"GET", b"POST"])
@pytest.mark.parametrize("path", [b"/sse", b"/drip"])
def test_streams_reach_the_client_at_once(
    stream_servers: dict[str, int], method: bytes, path: bytes
) -> None:
    """An endless SSE stream and a slow body start within a second, as they do direct."""
    direct_s, _ = _first_byte_s(stream_servers["upstream"], method, path)
    proxied_s, first = _first_byte_s(stream_servers["gateway"], method, path)
    assert first
    assert proxied_s < direct_s + 1.0, (direct_s, proxied_s)
