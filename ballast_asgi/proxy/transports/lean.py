"""The lean upstream transport: plain-http requests with an in-memory body on asyncio protocols.

Why: the aiohttp client (with multidict and yarl) was the largest block of the
gateway's samples at saturation, about 35 % (docs/bench.md, issue 18 item 4);
a proxy's common case needs little of it. ``LeanTransport`` is an
``AiohttpTransport`` whose direct path (``send_lean``, used by
``proxy/calls.py``) writes the request (request line, headers and body built
once, one write) on a pooled ``loop.create_connection`` connection and parses
the answer with ``httptools`` (``lean_wire.py``). Everything else goes the
aiohttp way unchanged: https upstreams, streamed request bodies, a header
block with CR or LF in it, and the httpx seam (``handle_async_request``).
docs/adr/0011-lean-upstream-client.md has the numbers.

Pool: idle keep-alive connections per ``(host, port)``, newest first, unused
after ``keepalive_s`` (checked when taken, swept in the background); at most
``max_connections`` open (in use + idle) across all upstreams, an idle one of
another upstream closed to make room, else the request waits for a slot.
Timeouts (``Limits``) are aiohttp's ``ClientTimeout`` as ``client_timeout``
builds it, or the same values as ``lean_limits`` gives them without the
dataclass (``proxy/calls.py``, per request with a deadline): ``connect``
bounds waiting for a slot plus connecting, ``sock_connect`` the connect,
``total`` the whole exchange (body included), ``sock_read`` the gap between
reads. Errors are httpx's as ``map_error`` gives them: refused ->
``ConnectError``, connect or slot timeout -> ``ConnectTimeout``; the rest in
``lean_wire.py``. No request is ever sent twice (no hidden retry, not even on
a pooled connection the upstream had closed).

A connection whose answer was a 500 sits out ``REST_S`` (50 ms) before it is
reused, and is dropped if the upstream closes it meanwhile. uvicorn, and so
every FastAPI or Starlette app, closes the connection right after the 500 of
an unhandled exception, without ``Connection: close`` (the FIN follows about
1 ms later, 5 ms at worst here, with the traceback logged); a request sent on
it in that moment was failed as a protocol error (retried for a GET, a 502
for a POST: 3-5 of 50 POSTs after a 500, issue 31's note). Other upstreams
keep such a connection: it comes back after the rest (no reconnect, no
TIME_WAIT); meanwhile it counts against ``max_connections``.

``begin`` is the lane's form (ADR 0020): no body, an idle connection taken and
the request written without waiting, the answer told to a callback.

Longer than 320 lines on purpose: the pool and both forms of the exchange
(awaited and told) share its connection bookkeeping, which stays in one place.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from ballast_asgi.core.types import RawHeaders
from ballast_asgi.proxy.transports.aiohttp_transport import AiohttpTransport
from ballast_asgi.proxy.transports.direct import DirectResponse
from ballast_asgi.proxy.transports.lean_conn import LeanLimits, Limits, lean_limits
from ballast_asgi.proxy.transports.lean_wire import Conn, LeanResponse, Notify
from ballast_asgi.proxy.upstream import Upstream

#: Bodies above this go in their own write (no copy into the head's bytes).
_JOIN_BODY_BYTES = 64 * 1024
#: How long a connection rests after a 500 before it is reused (see the module).
REST_S = 0.05


def request_head(
    method: str, upstream: Upstream, target: bytes, headers: RawHeaders
) -> bytes | None:
    """Request line and header block, or None when a CR or LF would split them.

    ``target`` is origin-form (the proxy refused anything else); the path is
    the upstream's base path plus it, as ``direct_url`` builds it.
    """
    if target[:1] not in (b"/", b"?", b""):
        return None
    path = upstream.base_path + target
    if path[:1] != b"/":
        path = b"/" + path
    line = (_METHODS.get(method) or method.encode("ascii") + b" ") + path + b" HTTP/1.1"
    # ``b": ".join`` of each (name, value) pair: no Python loop over the headers
    head = b"\r\n".join([line, *map(_FIELD, headers), b"\r\n"])
    breaks = len(headers) + 2  # one CRLF between lines, two after the last header
    if head.count(b"\n") != breaks or head.count(b"\r") != breaks:
        return None
    return head


#: The request line's start for the common methods (any other is encoded per request).
_METHODS = {m: m.encode("ascii") + b" " for m in ("GET", "HEAD", "POST", "PUT", "DELETE")}
_FIELD = b": ".join


class _Pool:
    """Keep-alive connections per (host, port), at most ``limit`` open in all."""

    def __init__(self, limit: int, keepalive_s: float, rest_s: float = REST_S) -> None:
        self.limit = limit
        self.keepalive_s = keepalive_s
        self.rest_s = rest_s
        self.idle: dict[tuple[str, int], list[Conn]] = {}
        self.idle_count = 0
        self.in_use = 0
        #: Connections sitting out ``rest_s`` after a 500 (open: they count to the limit).
        self.resting = 0
        self.closed = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        #: How a new connection is opened (None: ``_connect``); a test rig's fake one.
        self.connector: Callable[[tuple[str, int], Limits, float | None], Awaitable[Conn]] | None
        self.connector = None

    async def acquire(self, host: str, port: int, limits: Limits, deadline: float | None) -> Conn:
        """A connection for one exchange (pooled if one is fresh, else a new one)."""
        key = (host, port)
        until: float | None = None
        while True:
            conn = self.take(key)
            if conn is not None:
                return conn
            if self.in_use + self.idle_count + self.resting < self.limit:
                break
            if self.idle_count:
                self._evict()  # an idle connection of another upstream makes room
                continue
            if until is None:
                budget = _budget(limits.connect, deadline)
                until = float("inf") if budget is None else time_now() + budget
            await self._wait(until)
        self.in_use += 1
        try:
            opener = self.connector
            if opener is not None:
                return await opener(key, limits, deadline)
            return await self._connect(key, limits, deadline)
        except BaseException:
            self.release(None, False)
            raise

    def take(self, key: tuple[str, int], now: float | None = None) -> Conn | None:
        """The newest fresh idle connection to ``key`` (stale ones closed on the way);
        ``now``: the loop's time, when the caller has it."""
        idle = self.idle.get(key)
        if not idle:
            return None
        if now is None:
            now = time_now()
        while idle:
            conn = idle.pop()
            self.idle_count -= 1
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                self.in_use += 1
                return conn
            conn.close()
        return None

    async def _wait(self, until: float) -> None:
        """Wait for a released connection, until loop time ``until`` (then ConnectTimeout)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(None if until == float("inf") else until):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._wake()  # woken but leaving: the turn goes to the next waiter
            if isinstance(exc, TimeoutError):
                raise httpx.ConnectTimeout("no upstream connection free in time") from None
            raise

    async def _connect(self, key: tuple[str, int], limits: Limits, deadline: float | None) -> Conn:
        loop = asyncio.get_running_loop()
        connect = limits.sock_connect if limits.sock_connect is not None else limits.connect
        try:
            async with asyncio.timeout(_budget(connect, deadline)):
                _, conn = await loop.create_connection(lambda: Conn(key, self.release), *key)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return conn

    def release(self, conn: Conn | None, reuse: bool) -> None:
        """An exchange is over: keep ``conn`` for the next one or close it."""
        self.in_use -= 1
        if conn is not None:
            if not reuse or self.closed:
                conn.close()
            elif conn.rest:
                conn.rest = False
                self.resting += 1
                conn.loop.call_later(self.rest_s, self._rested, conn)
                return  # no room made: it is still open
            else:
                self._keep(conn)
        if self._waiters:
            self._wake()

    def _keep(self, conn: Conn) -> None:
        """``conn`` joins the idle connections of its upstream (newest last)."""
        conn.idle_since = conn.loop.time()
        idle = self.idle.get(conn.key)
        if idle is None:
            self.idle[conn.key] = [conn]
        else:
            idle.append(conn)
        self.idle_count += 1
        if self._sweeper is None:
            self._schedule_sweep()

    def _rested(self, conn: Conn) -> None:
        """After its rest: kept, unless the upstream (or the pool) closed it meanwhile."""
        self.resting -= 1
        if conn.closed or self.closed:
            conn.close()
        else:
            self._keep(conn)
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        """Let the longest-waiting request look for room again."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _evict(self) -> None:
        """Close the longest idle connection (of any upstream) to make room."""
        _, key = min((conns[0].idle_since, key) for key, conns in self.idle.items() if conns)
        self.idle[key].pop(0).close()
        self.idle_count -= 1

    def _schedule_sweep(self) -> None:
        self._sweeper = asyncio.get_running_loop().call_later(self.keepalive_s, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle for ``keepalive_s`` or closed by the upstream."""
        self._sweeper = None
        now = asyncio.get_running_loop().time()
        for key, conns in list(self.idle.items()):
            fresh = [c for c in conns if not c.closed and now - c.idle_since < self.keepalive_s]
            for conn in conns:
                if conn not in fresh:
                    conn.close()
            self.idle_count -= len(conns) - len(fresh)
            if fresh:
                self.idle[key] = fresh
            else:
                del self.idle[key]
        if self.idle_count and not self.closed:
            self._schedule_sweep()

    def close(self) -> None:
        """Close every idle connection; in-use ones close when their exchange ends."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()
        self.idle_count = 0


def time_now() -> float:
    """The running loop's clock."""
    return asyncio.get_running_loop().time()


def _budget(bound: float | None, deadline: float | None) -> float | None:
    """The smaller of a relative bound and the time left before ``deadline``."""
    if deadline is None:
        return bound
    left = deadline - asyncio.get_running_loop().time()
    return left if bound is None or left < bound else bound


class LeanTransport(AiohttpTransport):
    """``AiohttpTransport`` with a lean direct path for plain-http upstreams (``send_lean``)."""

    def __init__(self, **settings: Any) -> None:
        """``AiohttpTransport``'s settings (its limits bound both pools)."""
        super().__init__(**settings)
        self._pool = _Pool(self.max_connections, self.keepalive_s)

    def send_lean(
        self,
        method: str,
        upstream: Upstream,
        target: bytes,
        headers: RawHeaders,
        body: bytes,
        limits: Limits,
    ) -> Awaitable[DirectResponse] | None:
        """The exchange for an http upstream, or None when the aiohttp path must carry it."""
        if upstream.scheme != "http":
            return None
        head = request_head(method, upstream, target, headers)
        if head is None:
            return None
        return self._exchange(method == "HEAD", upstream, head, body, limits)

    def has_idle(self) -> bool:
        """Whether the pool holds an idle connection (to any upstream) now."""
        pool = self._pool
        return pool.idle_count > 0 and not pool.closed

    def begin(
        self,
        method: str,
        upstream: Upstream,
        target: bytes,
        headers: RawHeaders,
        limits: Limits,
        notify: Notify,
    ) -> LeanResponse | None:
        """``send_lean`` without a body and without waiting (the lane, ``gateway/lane.py``):
        the request written on an idle pooled connection now, the answer told to
        ``notify`` (``LeanResponse``); None (nothing taken, nothing sent) when the request
        needs the ordinary way: not plain http, a head with CR or LF, or no fresh idle
        connection to the upstream (connecting, or waiting for a slot, awaits)."""
        pool = self._pool
        if upstream.scheme != "http" or pool.closed or not pool.idle_count:
            return None
        head = request_head(method, upstream, target, headers)
        if head is None:
            return None
        key = (upstream.host, upstream.port)
        idle = pool.idle.get(key)
        if not idle:
            return None
        now = idle[-1].loop.time()  # the pool's loop (no ``get_running_loop`` per request)
        conn = pool.take(key, now)
        if conn is None:
            return None
        total = limits.total
        response = LeanResponse(
            conn, method == "HEAD", self.max_field_size, None if total is None else now + total,
            limits.sock_read, self.max_headers, now, notify,
        )  # fmt: skip
        conn.transport.write(head)  # type: ignore[union-attr]
        return response

    async def _exchange(
        self, head_only: bool, upstream: Upstream, head: bytes, body: bytes, limits: Limits
    ) -> DirectResponse:
        now = asyncio.get_running_loop().time()
        total = limits.total
        deadline = None if total is None else now + total
        pool = self._pool
        if pool.closed:
            pool = self._pool = _Pool(self.max_connections, self.keepalive_s)
        conn = pool.take((upstream.host, upstream.port), now)  # the common case: no await
        if conn is None:
            conn = await pool.acquire(upstream.host, upstream.port, limits, deadline)
            now = conn.loop.time()
        response = LeanResponse(
            conn, head_only, self.max_field_size, deadline, limits.sock_read, self.max_headers, now
        )
        transport = conn.transport
        assert transport is not None
        if len(body) > _JOIN_BODY_BYTES:
            transport.write(head)
            transport.write(body)
        else:
            transport.write(head + body if body else head)
        try:
            await response.head
        except BaseException:
            response.abort()  # cancelled or failed before the head: never reused
            raise
        return response

    async def aclose(self) -> None:
        """Close the lean pool's idle connections, then the aiohttp session."""
        self._pool.close()
        await super().aclose()


__all__ = ["LeanLimits", "LeanTransport", "Limits", "lean_limits", "request_head"]
