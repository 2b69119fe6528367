"""The terminal reverse proxy: a raw ASGI app that forwards to one upstream over httpx.

Forwarding rules (the proxy contract, tested in tests/test_proxy.py):

* method, path, raw query string and body are forwarded byte for byte. The
  path is taken relative to ``scope["root_path"]`` (when the app is mounted at
  ``/api``, ``/api/users`` goes upstream as ``<upstream base path>/users``),
  from ``raw_path`` so that ``%2F`` and friends survive; non-ASCII bytes are
  percent-encoded (an HTTP request target is ASCII).
* hop-by-hop headers are removed both ways: ``Connection`` and every header it
  names, ``Keep-Alive``, ``TE``, ``Trailer``, ``Transfer-Encoding``,
  ``Upgrade``, ``Proxy-*``. ``Host`` becomes the upstream's; the client's goes
  in ``X-Forwarded-Host``. ``X-Forwarded-For`` gets the client address
  appended; ``X-Forwarded-Proto`` is the scope's scheme.
* The request body is read in full before the upstream call (counted against
  ``max_body_bytes``: 413 without an upstream call, checked on
  ``Content-Length`` first), so a chunked request goes upstream with a
  ``Content-Length``, like nginx's request buffering.
* The response (status, headers incl. repeated ``Set-Cookie``, raw body) is
  streamed back unchanged; HEAD, 204 and 304 carry no body.
* Deadline: with a ``RequestContext`` deadline, ``X-Deadline-Ms`` carries the
  remaining milliseconds and every upstream timeout is the remaining time
  (504 at once when nothing remains; except a request dry-run admitted,
  ``ctx.would_shed``, which goes upstream with ``X-Deadline-Ms: 0`` and
  ``timeout_ms``); otherwise ``timeout_ms``.
* Failures are translated in one place, ``_failure``: timeouts -> 504,
  connect and protocol errors -> 502, small JSON bodies, no stack traces.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.outcome import AttemptOutcome, Outcome, limiter_signal
from ballast_asgi.core.types import Clock, RawHeaders, Receive, Scope, Send
from ballast_asgi.metrics import Metrics
from ballast_asgi.middleware.context import RequestContext, find_context
from ballast_asgi.middleware.responses import send_json
from ballast_asgi.proxy.headers import origin_form, raw_target, request_headers, response_headers
from ballast_asgi.proxy.transport import make_transport
from ballast_asgi.proxy.upstream import Selector, SingleUpstream, Upstream

#: httpx's ``timeout`` request extension.
Timeouts = dict[str, Any]
_NO_BODY_STATUSES = frozenset({204, 304})
#: Methods httpx gives ``Content-Length: 0`` when they have no body.
_EMPTY_LENGTH_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: A timeout this close to the request's deadline was the deadline, not the upstream.
_DEADLINE_SLACK_S = 0.002

_ERROR_BODIES: dict[str, tuple[int, dict[str, object]]] = {
    "timeout": (504, {"error": "gateway_timeout", "message": "upstream did not answer in time"}),
    "deadline": (
        504,
        {"error": "gateway_timeout", "message": "the request's deadline passed (X-Deadline-Ms)"},
    ),
    "connect": (502, {"error": "bad_gateway", "message": "upstream connection failed"}),
    "protocol": (502, {"error": "bad_gateway", "message": "upstream protocol error"}),
}

#: Error kind -> the attempt's outcome (kinds are ``ctx.upstream_error`` values).
_OUTCOMES = {
    "timeout": AttemptOutcome.TIMEOUT,
    "deadline": AttemptOutcome.DEADLINE,
    "connect": AttemptOutcome.CONNECT_ERROR,
    "protocol": AttemptOutcome.PROTOCOL_ERROR,
}
_BAD_TARGET: dict[str, object] = {
    "error": "bad_request",
    "message": "the request target must be origin-form (/path?query); nothing was forwarded",
}


class _ClientGone(Exception):
    """The client disconnected while its request body was being read."""


class ProxyApp:
    """Forwards every HTTP request to the upstream its selector chooses; one shared client.

    ``upstream`` is a URL (or an ``Upstream``) for the default single-upstream
    selector; ``selector`` replaces it (a pool, a canary split).
    """

    def __init__(
        self,
        upstream: str | Upstream | None = None,
        *,
        config: ProxyConfig = ProxyConfig(),  # noqa: B008 - frozen value object
        transport: httpx.AsyncBaseTransport | None = None,
        metrics: Metrics | None = None,
        clock: Clock = time.monotonic,
        selector: Selector | None = None,
    ) -> None:
        if selector is None:
            if upstream is None:
                raise ValueError("ProxyApp needs an upstream URL or a selector")
            one = upstream if isinstance(upstream, Upstream) else Upstream.parse(upstream)
            selector = SingleUpstream(one)
        self.selector = selector
        #: The first upstream (the only one with the default selector).
        self.upstream = selector.upstreams()[0]
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self._injected = transport
        self._client: httpx.AsyncClient | None = None
        self._transport: httpx.AsyncBaseTransport | None = None
        self._default_timeout = _timeouts(config.timeout_ms / 1000.0, config)

    # -- lifecycle ------------------------------------------------------------
    @property
    def client(self) -> httpx.AsyncClient:
        """The shared client (created on first use when lifespan never ran)."""
        if self._client is None:
            self._open()
        assert self._client is not None
        return self._client

    def _open(self) -> None:
        transport = self._injected or make_transport(self.config)
        self._client = httpx.AsyncClient(
            transport=transport,
            follow_redirects=False,
            trust_env=False,
            cookies=_refuse_cookies(),
        )
        for name in list(self._client.headers):
            del self._client.headers[name]
        self._transport = transport

    async def startup(self) -> None:
        """Create the shared client (idempotent)."""
        if self._client is None:
            self._open()

    async def aclose(self) -> None:
        """Close the shared client and its transport (idempotent)."""
        client, self._client, self._transport = self._client, None, None
        if client is not None:
            await client.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- requests -------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._handle(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            raise RuntimeError(f"ProxyApp serves http only, not {kind!r}")

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = find_context(scope)
        if not origin_form(scope):
            await self._refuse_target(send, ctx)
            return
        try:
            body = await self._read_body(scope, receive)
        except _ClientGone:
            if ctx is not None:
                ctx.client_gone = True
            return
        if body is None:
            await send_json(send, 413, {"error": "payload_too_large",
                                        "max_body_bytes": self.config.max_body_bytes})  # fmt: skip
            return
        timeout, deadline_ms = self._timeout_for(ctx)
        if timeout is None:
            if ctx is not None:
                ctx.attempt_outcome, ctx.head_rtt_s = AttemptOutcome.DEADLINE, None
            await self._failure(send, ctx, "deadline")
            return
        method: str = scope["method"]
        upstream = self.selector.choose(ctx, ())
        headers = request_headers(scope, deadline_ms)
        request = httpx.Request(
            method,
            upstream.url(raw_target(scope)),
            headers=_auto_headers(headers, upstream.netloc, method, body),
            stream=httpx.ByteStream(body),
            extensions={"timeout": timeout},
        )
        request.read()
        await self._exchange(request, upstream, scope, receive, send, ctx)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole request body, or None when it is larger than the limit."""
        limit = self.config.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return None
        message = await receive()
        if message["type"] != "http.request":
            raise _ClientGone
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            return body if len(body) <= limit else None
        return await self._read_rest(receive, [body], len(body), limit)

    async def _read_rest(
        self, receive: Receive, chunks: list[bytes], size: int, limit: int
    ) -> bytes | None:
        more = True
        while more:
            if size > limit:
                return None
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientGone
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks) if size <= limit else None

    def _timeout_for(
        self, ctx: RequestContext | None
    ) -> tuple[dict[str, Any] | None, bytes | None]:
        """httpx timeouts and the X-Deadline-Ms value; (None, None) when the deadline passed."""
        if ctx is None or ctx.deadline is None:
            return self._default_timeout, None
        remaining_s = ctx.deadline - self.clock()
        if remaining_s <= 0.0:
            if ctx.would_shed:  # admitted by dry-run: forwarded with 0 ms left
                return self._default_timeout, b"0"
            return None, None
        header = str(int(remaining_s * 1000.0)).encode("ascii")
        return _timeouts(remaining_s, self.config), header

    async def _exchange(
        self,
        request: httpx.Request,
        upstream: Upstream,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: RequestContext | None,
    ) -> None:
        transport = self._transport
        if transport is None:
            await self.startup()
            transport = self._transport
            assert transport is not None
        started = self.clock()
        try:
            response = await transport.handle_async_request(request)
        except httpx.TransportError as exc:
            kind = self._kind(exc, ctx)
            self._record(ctx, upstream, _OUTCOMES[kind], None)
            await self._failure(send, ctx, kind)
            return
        rtt_s = self.clock() - started
        if self.metrics is not None:
            self.metrics.upstream_latency.observe(rtt_s)
        status = response.status_code
        self._record(ctx, upstream, _status_outcome(status), rtt_s)
        try:
            await self._respond(response, scope, receive, send, ctx)
        finally:
            await response.aclose()

    def _record(
        self,
        ctx: RequestContext | None,
        upstream: Upstream,
        outcome: AttemptOutcome,
        rtt_s: float | None,
    ) -> None:
        """Record the attempt's outcome once, before its response head (the proxy/retry seam)."""
        if ctx is not None:
            ctx.attempt_outcome = outcome
            ctx.head_rtt_s = rtt_s
            ctx.tried_upstreams = (*ctx.tried_upstreams, upstream)
        self.selector.report(upstream, outcome, rtt_s, self.clock())

    async def _refuse_target(self, send: Send, ctx: RequestContext | None) -> None:
        """400 for a target that is not origin-form: the gateway's own refusal (counts nothing)."""
        if ctx is not None:
            ctx.attempt_outcome = AttemptOutcome.GATEWAY_ERROR
            ctx.outcome = limiter_signal(AttemptOutcome.GATEWAY_ERROR)
        await send_json(send, 400, _BAD_TARGET)

    async def _respond(
        self,
        response: httpx.Response,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: RequestContext | None,
    ) -> None:
        status = response.status_code
        headers, length = response_headers(response.headers.raw)
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
        except OSError:
            _gone(ctx)
            return
        if scope["method"] == "HEAD" or status in _NO_BODY_STATUSES or status < 200:
            length = 0
        try:
            await _stream(response.stream, length, receive, send, ctx)
        except httpx.TransportError as exc:
            self._count_error(ctx, self._kind(exc, ctx))

    def _kind(self, exc: httpx.TransportError, ctx: RequestContext | None) -> str:
        """``deadline`` when a timeout only enforced the request's own budget."""
        kind = _kind(exc)
        if (
            kind == "timeout"
            and ctx is not None
            and ctx.deadline is not None
            and self.clock() >= ctx.deadline - _DEADLINE_SLACK_S
        ):
            return "deadline"
        return kind

    async def _failure(self, send: Send, ctx: RequestContext | None, kind: str) -> None:
        """The one place an upstream failure becomes a response (502 or 504)."""
        self._count_error(ctx, kind)
        status, payload = _ERROR_BODIES[kind]
        await send_json(send, status, payload)

    def _count_error(self, ctx: RequestContext | None, kind: str) -> None:
        if ctx is not None:
            ctx.upstream_error = kind
            ctx.outcome = Outcome.DROPPED
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(kind).inc()


def _status_outcome(status: int) -> AttemptOutcome:
    """A response head's outcome: 5xx is a failure status, anything else a success."""
    return AttemptOutcome.STATUS_5XX if status >= 500 else AttemptOutcome.SUCCESS


async def _stream(
    stream: Any, length: int | None, receive: Receive, send: Send, ctx: RequestContext | None
) -> None:
    """Send the upstream body; stop (and let the caller close upstream) if the client leaves."""
    sent = 0
    finished = False
    watcher: asyncio.Task[Any] | None = None
    try:
        async for chunk in stream:
            if finished or not chunk or length == 0:
                continue  # drain to EOF so the connection can be reused
            if watcher is not None and watcher.done():
                _gone(ctx)
                return
            sent += len(chunk)
            finished = length is not None and sent >= length
            await send({"type": "http.response.body", "body": chunk, "more_body": not finished})
            if watcher is None and not finished:
                watcher = asyncio.ensure_future(_disconnected(receive))
        if not finished and (length is None or length == 0):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        _gone(ctx)
    finally:
        if watcher is not None:
            watcher.cancel()


async def _disconnected(receive: Receive) -> None:
    """Returns when the client disconnects (the request body was already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _gone(ctx: RequestContext | None) -> None:
    if ctx is not None:
        ctx.client_gone = True


def _kind(exc: httpx.TransportError) -> str:
    """Map an httpx failure to the proxy's error kind (the single mapping)."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    return "protocol"


def _auto_headers(headers: RawHeaders, host: bytes, method: str, body: bytes) -> RawHeaders:
    """``headers`` plus exactly what ``httpx.Request(content=body)`` would add to them.

    httpx puts ``Host`` first (when absent), then ``Content-Length: 0`` for an
    empty POST/PUT/PATCH without Content-Length or Transfer-Encoding, and
    appends ``Content-Length`` for a non-empty body without one. Building the
    request from a ``ByteStream`` with these headers gives the same request
    for a quarter of the CPU (no content encoding, no second ``Headers``).
    """
    has_host = has_length = has_chunked = False
    for name, _ in headers:
        lname = name.lower()
        if lname == b"host":
            has_host = True
        elif lname == b"content-length":
            has_length = True
        elif lname == b"transfer-encoding":
            has_chunked = True
    out: RawHeaders = [] if has_host else [(b"Host", host)]
    if not body and not (has_length or has_chunked) and method.upper() in _EMPTY_LENGTH_METHODS:
        out.append((b"Content-Length", b"0"))
    out.extend(headers)
    if body and not has_length:
        out.append((b"Content-Length", str(len(body)).encode("ascii")))
    return out


def _timeouts(seconds: float, config: ProxyConfig) -> Timeouts:
    connect = min(seconds, config.connect_timeout_ms / 1000.0)
    return {"connect": connect, "read": seconds, "write": seconds, "pool": seconds}


def _refuse_cookies() -> Any:
    from http.cookiejar import CookieJar

    class _RefusingJar(CookieJar):
        def extract_cookies(self, response: Any, request: Any) -> None:
            return None

        def set_cookie(self, cookie: Any) -> None:
            return None

    return _RefusingJar()


__all__ = ["ProxyApp"]
