"""One fake upstream behind two faces: an httpx.MockTransport handler and a real aiohttp server.

Both answer with the same logic (``respond``), so the proxy contract suite can
run unchanged over a mock transport and over real sockets on 127.0.0.1.

Paths: ``/cookies`` (two Set-Cookie), ``/gzip`` (gzip body, undecoded),
``/status/N`` (status N, no body), ``/hop`` (hop-by-hop response headers),
``/big`` (1 MiB in 64 KiB chunks), ``/slow`` (never answers: the mock raises
ReadTimeout), ``/refuse`` (mock: ConnectError); anything else echoes the
request as JSON: method, target, headers (list, repeats kept), body (latin-1).
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from aiohttp import web
from multidict import CIMultiDict

GZIP_BODY = gzip.compress(b"hello " * 200)
BIG_BODY = bytes(range(256)) * 4096  # 1 MiB
HOP_HEADERS = [
    ("connection", "x-secret"),
    ("x-secret", "1"),
    ("keep-alive", "timeout=5"),
    ("proxy-authenticate", "Basic"),
    ("upgrade", "h2c"),
    ("x-kept", "yes"),
]

Answer = tuple[int, list[tuple[str, str]], bytes]


def respond(method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> Answer:
    """The fake upstream's answer to one request."""
    path = target.split(b"?", 1)[0]
    if path.endswith(b"/cookies"):
        return 200, [("set-cookie", "a=1; Path=/"), ("set-cookie", "b=2; Path=/")], b"ok"
    if path.endswith(b"/gzip"):
        return 200, [("content-encoding", "gzip"), ("content-type", "text/plain")], GZIP_BODY
    if b"/status/" in path:
        return int(path.rsplit(b"/", 1)[1]), [("etag", '"v1"')], b""
    if path.endswith(b"/hop"):
        return 200, HOP_HEADERS, b"hop"
    if path.endswith(b"/big"):
        return 200, [("content-type", "application/octet-stream")], BIG_BODY
    echo = {
        "method": method,
        "target": target.decode("latin-1"),
        "headers": [[k.decode("latin-1").lower(), v.decode("latin-1")] for k, v in headers],
        "body": body.decode("latin-1"),
    }
    return 200, [("content-type", "application/json")], json.dumps(echo).encode()


async def mock_handler(request: httpx.Request) -> httpx.Response:
    """The MockTransport face; failures are raised as httpx exceptions."""
    path = request.url.raw_path
    if path.startswith(b"/slow"):
        raise httpx.ReadTimeout("slow", request=request)
    if path.startswith(b"/refuse"):
        raise httpx.ConnectError("refused", request=request)
    body = await request.aread()
    status, headers, content = respond(request.method, path, request.headers.raw, body)
    if status in (204, 304) or request.method == "HEAD":
        content = b""
    return httpx.Response(status, headers=headers, content=content)


async def _web_handler(request: web.BaseRequest) -> web.StreamResponse:
    if request.path.startswith("/slow"):
        await asyncio.Event().wait()
    body = await request.content.read()  # no client_max_size cap
    status, headers, content = respond(
        request.method, request.raw_path.encode(), list(request.raw_headers), body
    )
    if status in (204, 304):
        return web.Response(status=status, headers=CIMultiDict(headers))
    if request.path.endswith("/big"):
        return await _stream_big(request, headers)
    return web.Response(status=status, headers=CIMultiDict(headers), body=content)


async def _stream_big(
    request: web.BaseRequest, headers: list[tuple[str, str]]
) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers=CIMultiDict(headers))
    await response.prepare(request)
    for i in range(0, len(BIG_BODY), 65_536):
        await response.write(BIG_BODY[i : i + 65_536])
    await response.write_eof()
    return response


@asynccontextmanager
async def real_upstream() -> AsyncIterator[str]:
    """A real aiohttp server on a free 127.0.0.1 port in this event loop; yields its URL."""
    runner = web.ServerRunner(web.Server(_web_handler), handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
