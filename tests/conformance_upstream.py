"""A small httpbin-like upstream for the proxy conformance test (raw ASGI, run on uvicorn).

Why our own: the conformance table also needs endless server-sent events,
slow bodies for POST, non-ASCII response headers and a websocket echo, which
httpbin does not have; and the suite must not depend on Flask/Werkzeug
versions. Endpoints (all deterministic):

``/anything...``  echo: method, target, headers (latin-1), body (base64) as JSON
``/status/N``     status N, empty body
``/redirect``     302 to the relative ``/anything/next``
``/absolute``     302 to ``http://<Host>/anything/abs`` (built from the Host it got)
``/cookies``      two Set-Cookie headers
``/gzip``         a gzip body with Content-Encoding (never decoded)
``/bytes/N``      N deterministic bytes, Content-Length
``/stream/N``     N deterministic bytes, chunked in 64 KiB pieces (no Content-Length)
``/etag/E``       ETag "E"; 304 when If-None-Match matches
``/latin``        response headers with Latin-1 and UTF-8 bytes
``/sse``          endless text/event-stream, one event every 50 ms (GET or POST; ends
                  when the client is gone)
``/drip``         10 bytes, one every 100 ms (GET or POST)
websocket         echoes text and bytes; closes with the client's code
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from typing import Any

Scope = dict[str, Any]
GZIP_BODY = gzip.compress(b"conformance " * 100, mtime=0)
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def payload(n: int) -> bytes:
    """``n`` deterministic bytes."""
    block = bytes(range(256))
    return (block * (n // 256 + 1))[:n]


async def _body(receive: Any) -> bytes:
    chunks = []
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _respond(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _echo(scope: Scope, body: bytes) -> bytes:
    target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
    doc = {
        "method": scope["method"],
        "target": target.decode("latin-1"),
        "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
        "body": base64.b64encode(body).decode(),
    }
    return json.dumps(doc).encode()


async def _gone(receive: Any) -> None:
    """Returns once the client has disconnected (a request body is read and dropped)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _ticks(
    send: Any, receive: Any, start: list[tuple[bytes, bytes]], ticks: Any, gap_s: float
) -> None:
    """One tick every ``gap_s`` until the last or until the client is gone (uvicorn drops the
    sends after a disconnect without raising: an endless stream would tick on forever and
    keep its server from stopping)."""
    gone = asyncio.ensure_future(_gone(receive))
    try:
        await send({"type": "http.response.start", "status": 200, "headers": start})
        for tick in ticks:
            await send({"type": "http.response.body", "body": tick, "more_body": True})
            await asyncio.wait({gone}, timeout=gap_s)  # the upstream's pacing
            if gone.done():
                return
        await send({"type": "http.response.body", "body": b""})
    finally:
        gone.cancel()


def _sse_events() -> Any:
    n = 0
    while True:
        n += 1
        yield f"id: {n}\ndata: tick {n}\n\n".encode()


async def _websocket(receive: Any, send: Any) -> None:
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": message.get("text"),
                    "bytes": message.get("bytes")})  # fmt: skip


async def app(scope: Scope, receive: Any, send: Any) -> None:
    """The upstream (an ASGI app)."""
    if scope["type"] == "websocket":
        await _websocket(receive, send)
        return
    if scope["type"] != "http":
        return
    path: str = scope["path"]
    if path == "/sse":
        await _ticks(send, receive, SSE_HEADERS, _sse_events(), 0.05)
        return
    if path == "/drip":
        octets = [(b"content-type", b"application/octet-stream")]
        await _ticks(send, receive, octets, [b"*"] * 10, 0.1)
        return
    body = await _body(receive)
    status, headers, out = _route(scope, path, body)
    if path.startswith("/stream/"):
        await _chunked(send, headers, out)
        return
    if scope["method"] == "HEAD" or status in (204, 304):
        length = (b"content-length", str(len(out)).encode())
        await send({"type": "http.response.start", "status": status, "headers": [*headers, length]})
        await send({"type": "http.response.body", "body": b""})
        return
    await _respond(send, status, headers, out)


async def _chunked(send: Any, headers: list[tuple[bytes, bytes]], out: bytes) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for i in range(0, len(out), 65536):
        await send({"type": "http.response.body", "body": out[i : i + 65536], "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _route(scope: Scope, path: str, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    octet = [(b"content-type", b"application/octet-stream")]
    if path.startswith("/anything"):
        return 200, [(b"content-type", b"application/json")], _echo(scope, body)
    if path.startswith("/status/"):
        return int(path.rsplit("/", 1)[1]), [], b""
    if path == "/redirect":
        return 302, [(b"location", b"/anything/next")], b""
    if path == "/absolute":
        host = dict(scope["headers"]).get(b"host", b"")
        return 302, [(b"location", b"http://" + host + b"/anything/abs")], b""
    if path == "/cookies":
        return 200, [(b"set-cookie", b"a=1; Path=/"), (b"set-cookie", b"b=2; HttpOnly")], b"ok"
    if path == "/gzip":
        return 200, [(b"content-encoding", b"gzip"), (b"content-type", b"text/plain")], GZIP_BODY
    if path.startswith(("/bytes/", "/stream/")):
        return 200, octet, payload(int(path.rsplit("/", 1)[1]))
    if path.startswith("/etag/"):
        etag = b'"' + path.rsplit("/", 1)[1].encode() + b'"'
        match = dict(scope["headers"]).get(b"if-none-match") == etag
        return (304 if match else 200), [(b"etag", etag)], b"" if match else b"fresh"
    if path == "/latin":
        return 200, [(b"x-latin1", b"caf\xe9"), (b"x-utf8", b"caf\xc3\xa9")], b"latin"
    return 404, [], b"not found"
