"""The lean client: HTTP/1.1 on asyncio protocols, a keep-alive pool, no task per request.

Sending a request is one ``transport.write`` of prebuilt bytes on an idle
pooled connection (a new connection only when none is idle); the response is
parsed in ``data_received`` (status line, ``Content-Length`` or chunked
body, ``X-Ballast-Reason``, ``Connection: close``) and handed to the runner's
``done`` callback. A per-request timer (``loop.call_at``) gives up at the
client deadline and aborts that connection. No pipelining: one request per
connection at a time. Only ``http://`` targets; the aiohttp client covers the rest.

It costs a fraction of aiohttp's CPU per request (``docs/instruments.md``),
which is what lets one generator process offer 3,000 rps on schedule while
sharing a core with the simulator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

#: ``done(slot, status, reason, detail)``: status 0 and a detail on failure.
Done = Callable[[int, int, str | None, str], None]

_HEAD_END = b"\r\n\r\n"


def request_prefix(target: str, method: str) -> tuple[str, int, bytes]:
    """(host, port, the request bytes up to the per-request headers) of ``target``."""
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise ValueError(f"the lean client needs an http:// URL, got {target!r}")
    port = url.port or 80
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    host = url.netloc.rsplit("@", 1)[-1]
    body_len = "" if method in ("GET", "HEAD") else "Content-Length: 0\r\n"
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{body_len}"
    return url.hostname, port, head.encode("latin-1")


class _Response:
    """Incremental parser of one response (head, then a length-delimited or chunked body)."""

    __slots__ = ("buf", "chunked", "close", "head_done", "reason", "remaining", "status")

    def __init__(self) -> None:
        self.buf = b""
        self.head_done = False
        self.status = 0
        self.reason: str | None = None
        self.remaining = -1  # body bytes still due; -1: until the connection closes
        self.chunked = False
        self.close = False

    def feed(self, data: bytes) -> bool:
        """Take bytes; True once the whole response has arrived."""
        self.buf += data
        if not self.head_done:
            end = self.buf.find(_HEAD_END)
            if end < 0:
                return False
            self._head(self.buf[:end])
            self.buf = self.buf[end + 4 :]
        return self._chunks() if self.chunked else self._body()

    def _head(self, head: bytes) -> None:
        self.head_done = True
        self.status = int(head[9:12])
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == b"content-length":
                self.remaining = int(value)
            elif key == b"x-ballast-reason":
                self.reason = value.strip().decode("latin-1")
            elif key == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif key == b"connection":
                self.close = b"close" in value.lower()
        if self.status in (204, 304) or 100 <= self.status < 200:
            self.remaining = 0

    def _body(self) -> bool:
        if self.remaining < 0:
            self.buf = b""
            return False
        take = min(self.remaining, len(self.buf))
        self.remaining -= take
        self.buf = self.buf[take:]
        return self.remaining == 0

    def _chunks(self) -> bool:
        while True:
            if self.remaining > 0:  # inside a chunk (data plus its CRLF)
                take = min(self.remaining, len(self.buf))
                self.remaining -= take
                self.buf = self.buf[take:]
                if self.remaining:
                    return False
            line_end = self.buf.find(b"\r\n")
            if line_end < 0:
                return False
            size = int(self.buf[:line_end].split(b";")[0], 16)
            self.buf = self.buf[line_end + 2 :]
            if size == 0:
                return self._trailers()
            self.remaining = size + 2

    def _trailers(self) -> bool:
        if self.buf.startswith(b"\r\n"):
            return True
        self.chunked, self.remaining = False, 0  # trailers: wait for their blank line
        end = self.buf.find(_HEAD_END)
        return end >= 0


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying at most one request at a time."""

    def __init__(self, pool: LeanPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.slot = -1
        self.response = _Response()
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def send(self, slot: int, data: bytes, timeout_s: float) -> None:
        assert self.transport is not None
        self.slot, self.response = slot, _Response()
        self.timer = self.pool.loop.call_later(timeout_s, self._timeout)
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.slot < 0:
            return  # nothing outstanding: stray bytes, ignore
        try:
            complete = self.response.feed(data)
        except ValueError:
            self._finish(0, None, "ProtocolError", reuse=False)
            return
        if complete:
            r = self.response
            self._finish(r.status, r.reason, "", reuse=not r.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.slot >= 0:
            r = self.response
            if r.head_done and r.remaining < 0 and not r.chunked:
                self._finish(r.status, r.reason, "", reuse=False)  # body ran until close
            else:
                self._finish(0, None, "ServerDisconnectedError", reuse=False)
        self.pool.forget(self)

    def _timeout(self) -> None:
        self.timer = None
        self._finish(0, None, "timeout", reuse=False)

    def _finish(self, status: int, reason: str | None, detail: str, *, reuse: bool) -> None:
        slot, self.slot = self.slot, -1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if reuse and self.transport is not None:
            self.pool.idle.append(self)
        elif self.transport is not None:
            self.transport.abort()
        self.pool.done(slot, status, reason, detail)


class LeanPool:
    """Idle keep-alive connections to one host; opens more when all are busy."""

    def __init__(self, host: str, port: int, done: Done) -> None:
        self.host, self.port, self.done = host, port, done
        self.loop = asyncio.get_running_loop()
        self.idle: list[_Conn] = []
        self.conns: set[_Conn] = set()
        self.connecting: set[asyncio.Task[None]] = set()

    def send(self, slot: int, data: bytes, timeout_s: float) -> None:
        """Send on an idle connection, or open one and send when it is up."""
        while self.idle:
            conn = self.idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                conn.send(slot, data, timeout_s)
                return
        task = self.loop.create_task(self._connect_and_send(slot, data, timeout_s))
        self.connecting.add(task)
        task.add_done_callback(self.connecting.discard)

    async def warm(self, n: int) -> None:
        """Open ``n`` idle keep-alive connections now (before the schedule starts).

        A connection that fails to open is skipped: the schedule opens what it
        still needs on demand, as without warming.
        """

        async def one() -> None:
            try:
                _, conn = await self.loop.create_connection(
                    lambda: _Conn(self), self.host, self.port
                )
            except OSError:
                return
            self.conns.add(conn)
            self.idle.append(conn)

        await asyncio.gather(*(one() for _ in range(n)))

    async def _connect_and_send(self, slot: int, data: bytes, timeout_s: float) -> None:
        started = self.loop.time()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await self.loop.create_connection(
                    lambda: _Conn(self), self.host, self.port
                )
        except TimeoutError:
            self.done(slot, 0, None, "timeout")
            return
        except OSError as exc:
            self.done(slot, 0, None, type(exc).__name__)
            return
        self.conns.add(conn)
        conn.send(slot, data, max(0.0, timeout_s - (self.loop.time() - started)))

    def forget(self, conn: _Conn) -> None:
        """A connection closed: drop it from the pool."""
        self.conns.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)

    async def close(self) -> None:
        """Close every connection (outstanding requests end as errors)."""
        for task in list(self.connecting):
            task.cancel()
        await asyncio.gather(*self.connecting, return_exceptions=True)
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()
