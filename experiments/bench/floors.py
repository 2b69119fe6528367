"""The floors a Python proxy can reach on this machine, for the headroom table (issue 31 item 2).

Two pass-through proxies with nothing of the gateway in them, so that the
gateway's proxied cost can be split into "Python", "ASGI" and "our code":

* ``raw``: an ``asyncio.Protocol`` server parsing requests with ``httptools``
  and forwarding each one on its own upstream keep-alive connection (one per
  client connection), parsing the answer with ``httptools`` too; everything in
  parser callbacks: no ASGI, no coroutine or task per request, no stages. The
  floor of any Python proxy on uvloop.
* ``asgi``: a raw ASGI callable under uvicorn (uvloop, httptools, no access
  log, no date/server header: the gateway form's settings) that writes each
  request on a pooled upstream connection of the same kind and awaits its
  answer: uvicorn's request cycle and one coroutine per request, still no
  stages. The floor of an ASGI proxy.

Both are measurement fixtures, not proxies: requests without a body only
(GET/HEAD as wrk sends them), upstream answers framed by Content-Length or
chunked (decoded and re-framed with a length), hop-by-hop headers dropped both
ways, no timeouts, no limits, no errors beyond a 502 when the upstream goes.

    python -m experiments.bench.floors raw --upstream-port P --port Q
    uvicorn experiments.bench.floors:asgi_app   (UPSTREAM_PORT=P in the environment)
"""

from __future__ import annotations

import argparse
import asyncio
import os
from http import HTTPStatus
from typing import Any

import httptools

HOST = "127.0.0.1"
#: Dropped both ways (hop-by-hop, or rewritten: host and the framing).
HOP = frozenset(
    b"connection keep-alive proxy-authenticate proxy-authorization te trailer "
    b"transfer-encoding upgrade host content-length date server".split()
)
_BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n`` (reason from ``http.HTTPStatus``)."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    return f"HTTP/1.1 {status} {reason}\r\n".encode("ascii")


def request_head(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                 netloc: bytes) -> bytes:  # fmt: skip
    """The upstream request head: request line, ``host`` of the upstream, end-to-end headers."""
    lines = [method + b" " + target + b" HTTP/1.1", b"host: " + netloc]
    lines += [n + b": " + v for n, v in headers if n not in HOP]
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Upstream(asyncio.Protocol):
    """One upstream keep-alive connection: the answer to the request written last."""

    def __init__(self, on_response: Any) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.on_response = on_response
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.keep = True

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.headers, self.body = [], []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep = self.parser.should_keep_alive()
        self.on_response(self, self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        self.keep = False
        self.transport = None
        self.on_response(self, 0)


def response_bytes(status: int, headers: list[tuple[bytes, bytes]], body: list[bytes],
                   head_only: bool) -> bytes:  # fmt: skip
    """The client's response: status line, end-to-end headers, the body with its length."""
    data = b"".join(body)
    out = [status_line(status)]
    out += [n + b": " + v + b"\r\n" for n, v in headers if n not in HOP]
    out.append(b"content-length: %d\r\n\r\n" % len(data))
    if not head_only:
        out.append(data)
    return b"".join(out)


class RawProxy(asyncio.Protocol):
    """The ``raw`` floor: one client connection, one upstream connection, callbacks only."""

    def __init__(self, upstream_port: int) -> None:
        self.port = upstream_port
        self.netloc = f"{HOST}:{upstream_port}".encode("ascii")
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.upstream: Upstream | None = None
        self.waiting: bytes | None = None  # the first request, while connecting
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_only = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        loop = asyncio.get_running_loop()
        connect = loop.create_connection(lambda: Upstream(self.answered), HOST, self.port)
        loop.create_task(connect).add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            self._fail()
            return
        self.upstream = task.result()[1]
        if self.transport is None:  # the client left meanwhile
            self.upstream.transport.close()  # type: ignore[union-attr]
        elif self.waiting is not None:
            self.upstream.transport.write(self.waiting)  # type: ignore[union-attr]
            self.waiting = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail()

    def on_message_begin(self) -> None:
        self.url, self.headers = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        method = self.parser.get_method()
        self.head_only = method == b"HEAD"
        head = request_head(method, self.url, self.headers, self.netloc)
        up = self.upstream
        if up is None or up.transport is None:
            self.waiting = head
        else:
            up.transport.write(head)

    def answered(self, up: Upstream, status: int) -> None:
        if self.transport is None:
            return
        if status == 0:
            self._fail()
            return
        self.transport.write(response_bytes(status, up.headers, up.body, self.head_only))
        if not up.keep:
            self.transport.close()

    def _fail(self) -> None:
        if self.transport is not None:
            self.transport.write(_BAD_GATEWAY)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


async def serve_raw(port: int, upstream_port: int) -> None:
    """Serve the ``raw`` floor on ``port`` until cancelled."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: RawProxy(upstream_port), HOST, port, backlog=4096)
    async with server:
        await server.serve_forever()


class _AsgiPool:
    """Idle upstream connections for ``asgi_app`` (no bound: wrk's connections are few)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.netloc = f"{HOST}:{port}".encode("ascii")
        self.idle: list[Upstream] = []

    async def exchange(self, head: bytes) -> tuple[Upstream, int]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[int] = loop.create_future()

        def answered(_up: Upstream, status: int) -> None:
            if not waiter.done():
                waiter.set_result(status)

        if self.idle:
            up = self.idle.pop()
            up.on_response = answered
        else:
            up = (await loop.create_connection(lambda: Upstream(answered), HOST, self.port))[1]
        assert up.transport is not None
        up.transport.write(head)
        status = await waiter
        if status and up.keep:
            self.idle.append(up)
        return up, status


_POOL: dict[str, _AsgiPool] = {}


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ``asgi`` floor (``UPSTREAM_PORT`` in the environment)."""
    if scope["type"] != "http":
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        return
    pool = _POOL.get("up")
    if pool is None:
        pool = _POOL["up"] = _AsgiPool(int(os.environ["UPSTREAM_PORT"]))
    target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
    method = scope["method"].encode("ascii")
    up, status = await pool.exchange(request_head(method, target, scope["headers"], pool.netloc))
    if not status:
        await send({"type": "http.response.start", "status": 502, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b"".join(up.body)
    headers = [(n, v) for n, v in up.headers if n not in HOP]
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == b"HEAD" else body})


def main(argv: list[str] | None = None) -> None:
    """``raw`` floor as a child process (the ``asgi`` one runs under uvicorn)."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench.floors")
    p.add_argument("role", choices=("raw",))
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    import uvloop

    uvloop.install()
    asyncio.run(serve_raw(args.port, args.upstream_port))


if __name__ == "__main__":
    main()
