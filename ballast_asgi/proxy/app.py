"""The terminal reverse proxy: a raw ASGI app that forwards to the chosen upstream over httpx.

Forwarding rules (the proxy contract, tested in tests/proxy/test_proxy*.py;
docs/proxying.md says it for users):

* Only origin-form targets (``/path?query``) are proxied; anything else gets
  400 and nothing is forwarded. The upstream URL is built from the parsed
  upstream's parts and the target (``upstream.py``), never by gluing strings.
* method, path, raw query string and body are forwarded byte for byte. The
  path is taken relative to ``scope["root_path"]``, from ``raw_path`` so that
  ``%2F`` and friends survive; non-printable bytes are percent-encoded.
* Header rules (``headers.py``): hop-by-hop headers and ``Expect`` are
  removed both ways; ``Host`` becomes the upstream's; ``X-Forwarded-*`` are
  set; nothing else is added (no ``Content-Type``, no ``Content-Length: 0``).
* Framing (issue 27): the declared body comes from the one parse of the head
  (``ctx.head``, or ``core/head.read_head`` here when no admission stage ran,
  with the same refusals); the client's ``Content-Length`` and
  ``Transfer-Encoding`` are never forwarded. The proxy writes its own: the
  length of a read body (a body that is not its declared length is a 400,
  never forwarded), the declared length of a streamed one (held to it), or
  ``chunked``.
* Bodies (``body.py``): a request body with a Content-Length up to
  ``request_buffer_bytes`` is read first; a larger or chunked one streams
  upstream. A declared Content-Length above ``max_body_bytes`` gets 413 at
  once; a streamed body that passes it, 413 (or an abort once a head was sent).
  The response streams back with backpressure; a client that takes no data
  for ``send_timeout_ms`` and an upstream failure mid-body abort the client
  connection (raise), never a complete-looking response.
* The attempt's ``AttemptOutcome`` and its time to the response head are
  recorded on the context before the head is sent, and reported to the
  selector.
* Deadline: with a ``RequestContext`` deadline, ``X-Deadline-Ms`` carries the
  remaining milliseconds, the wait for the response head and (aiohttp) the
  whole exchange are bounded by it (504 at once when nothing remains; except
  a request dry-run admitted, ``ctx.would_shed``, which goes upstream with
  ``X-Deadline-Ms: 0`` and ``timeout_ms``); otherwise ``timeout_ms`` bounds the
  wait for the head and each read.
* Failures are translated in one place (``failures.py``): timeouts -> 504,
  connect and protocol errors -> 502. A response head the gateway cannot
  relay faithfully (``headers.response_head``: a status outside 200-599, too
  many or too large header fields, a bad Content-Length, a transfer coding
  other than ``chunked``) is a protocol error too, refused before any byte of
  it reaches the client; a 204 or 304 is relayed without its Content-Length.
* The call itself (``calls.py``): on our own transports an in-memory body goes
  without httpx objects (the default lean transport's ``send_lean`` for plain
  http upstreams, aiohttp's ``send_direct`` otherwise); everything else
  (streamed bodies, injected transports such as ``httpx.MockTransport``) is an
  ``httpx.Request`` through the transport. Same bytes, same errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, cast

import httpx

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.head import NO_HEAD, HeadLimits, RequestHead, read_head
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Clock, RawHeaders, Receive, Scope, Send
from ballast_asgi.middleware.context import RequestContext, find_context
from ballast_asgi.middleware.responses import send_json, send_refusal
from ballast_asgi.proxy.body import (
    UNTIMED_BYTES,
    BodyMismatch,
    BodyTooLarge,
    ClientGone,
    ClientSendTimeout,
    RequestBodyStream,
    UpstreamBodyError,
    disconnected,
    read_body,
    relay,
)
from ballast_asgi.proxy.calls import Response, Timeouts, direct_call, httpx_request
from ballast_asgi.proxy.failures import (
    BAD_TARGET,
    ERROR_BODIES,
    OUTCOMES,
    kind_of,
    status_outcome,
    too_large,
)
from ballast_asgi.proxy.headers import (
    DEADLINE,
    BadResponseHead,
    origin_form,
    request_headers,
    response_head,
)
from ballast_asgi.proxy.redirects import client_host, rewrite_locations
from ballast_asgi.proxy.server import drop_request_trailers
from ballast_asgi.proxy.transports import AiohttpTransport, DirectResponse, make_transport
from ballast_asgi.proxy.transports.aiohttp_transport import client_timeout
from ballast_asgi.proxy.upstream import Selector, SingleUpstream, Upstream
from ballast_asgi.telemetry.events import emit
from ballast_asgi.telemetry.metrics import Metrics

_NO_BODY_STATUSES = frozenset({204, 304})
#: The response head as relayed: headers, Content-Length (None: unknown), has a Location.
Head = tuple[RawHeaders, int | None, bool]
#: The head checks of a proxy without an admission stage: framing only, no size bounds.
_FRAMING_ONLY = HeadLimits(max_headers=0, max_header_bytes=0)
_CONTENT_LENGTH = b"content-length"
_CHUNKED = (b"transfer-encoding", b"chunked")
#: A timeout this close to the request's deadline was the deadline, not the upstream.
_DEADLINE_SLACK_S = 0.002


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
        self._bounds_total = False
        #: Our aiohttp (or lean) transport: in-memory bodies skip the httpx objects.
        self._direct: AiohttpTransport | None = None
        self._client: httpx.AsyncClient | None = None
        self._transport: httpx.AsyncBaseTransport | None = None
        self._default_timeout = _timeouts(config.timeout_ms / 1000.0, config)
        #: aiohttp's form of it, built once (requests without a deadline all use it).
        self._default_limits = client_timeout(self._default_timeout)
        self._send_timeout_s = config.send_timeout_ms / 1000.0
        self._max_headers = config.max_response_headers
        self._max_head_bytes = config.max_response_head_bytes
        drop_request_trailers()  # before uvicorn parses a request: trailers are not headers

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
        #: aiohttp bounds the whole exchange by the deadline itself (``total``); any
        #: other transport gets an asyncio timeout around the wait for the head.
        self._bounds_total = isinstance(transport, AiohttpTransport)
        self._direct = transport if isinstance(transport, AiohttpTransport) else None
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
        self._direct = None
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
        """Forward one HTTP request (the body of the call: no extra coroutine per request)."""
        if scope["type"] != "http":
            await self._not_http(scope, receive, send)
            return
        ctx = find_context(scope)
        if not origin_form(scope):
            await self._refuse(send, ctx, 400, BAD_TARGET)
            return
        try:
            head = _head(scope, ctx)
        except HeaderError as exc:
            if ctx is not None:
                ctx.record(AttemptOutcome.GATEWAY_ERROR)
            await send_refusal(send, exc)
            return
        length = head.content_length
        limit = self.config.max_body_bytes
        if length is not None and length > limit:
            await self._refuse(send, ctx, 413, too_large(limit))
            return
        headers = request_headers(scope, ctx is not None and ctx.deadline is not None)
        source: RequestBodyStream | None = None
        if head.chunked or (length is not None and length > self.config.request_buffer_bytes):
            source = RequestBodyStream(receive, limit, length)  # held to exactly ``length``
            headers.append(_CHUNKED if length is None else _length_header(length))
            stream: httpx.AsyncByteStream | bytes = source
        else:
            try:
                body = await read_body(receive, limit)
            except ClientGone:
                _gone(ctx)
                return
            if body is None:
                await self._refuse(send, ctx, 413, too_large(limit))
                return
            if length is not None and len(body) != length:
                await self._refuse(send, ctx, 400, _MISMATCH)
                return
            if body or length is not None:  # framed by the bytes read, whatever was declared
                headers.append(_length_header(len(body)))
            stream = body
        await self._forward(scope, receive, send, ctx, headers, stream, source)

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            raise RuntimeError(f"ProxyApp serves http only, not {scope['type']!r}")
        await self._lifespan(receive, send)

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: RequestContext | None,
        headers: RawHeaders,
        stream: httpx.AsyncByteStream | bytes,
        source: RequestBodyStream | None,
    ) -> None:
        timeout, deadline_ms = self._timeout_for(ctx)
        if timeout is None:
            if ctx is not None:
                ctx.record(AttemptOutcome.DEADLINE)
            await self._failure(send, ctx, "deadline")
            return
        if deadline_ms is not None:
            headers.append((DEADLINE, deadline_ms))
        tried = () if ctx is None else cast("tuple[Upstream, ...]", ctx.tried_upstreams)
        upstream = self.selector.choose(ctx, tried)
        host = client_host(scope) if self.config.preserve_host else None
        headers.insert(0, (b"host", host or upstream.netloc))
        limits = self._default_limits if timeout is self._default_timeout else None
        call = direct_call(self._direct, scope, upstream, headers, stream, timeout, limits)
        if call is None:
            request = httpx_request(scope, upstream, headers, stream, timeout, source)
            call = self._send_httpx(request)
        head_s = timeout["read"] if "total" in timeout and not self._bounds_total else None
        attempt = await self._attempt(call, upstream, send, ctx, source, head_s)
        if attempt is not None:
            response, head = attempt
            try:
                await self._respond(response, head, upstream, scope, receive, send, ctx, source)
            finally:
                await response.aclose()

    async def _send_httpx(self, request: httpx.Request) -> httpx.Response:
        transport = self._transport
        if transport is None:
            await self.startup()
            transport = self._transport
            assert transport is not None
        return await transport.handle_async_request(request)

    async def _attempt(
        self,
        call: Awaitable[Response],
        upstream: Upstream,
        send: Send,
        ctx: RequestContext | None,
        source: RequestBodyStream | None,
        head_s: float | None,
    ) -> tuple[Response, Head] | None:
        """One upstream call up to the checked response head (bounded by ``head_s``),
        recorded once; a head ``response_head`` refuses is a protocol error (502)."""
        started = self.clock()
        try:
            if head_s is None:
                response = await call
            else:
                async with asyncio.timeout(head_s):
                    response = await call
        except (httpx.TransportError, TimeoutError, ClientGone, BodyTooLarge, BodyMismatch) as exc:
            await self._attempt_failed(exc, upstream, send, ctx, source)
            return None
        status = response.status_code
        raw = response.raw_headers if isinstance(response, DirectResponse) else response.headers.raw
        try:
            controls = not getattr(response, "values_checked", False)
            head = response_head(status, raw, self._max_headers, self._max_head_bytes, controls)
        except BadResponseHead as exc:
            await response.aclose()  # not read: the upstream connection is closed
            await self._attempt_failed(exc, upstream, send, ctx, source)
            return None
        now = self.clock()
        rtt_s = now - started
        if self.metrics is not None:
            self.metrics.upstream_latency.observe(rtt_s)
        outcome = status_outcome(status) if ctx is None else ctx.status_outcome(status)
        self._record(ctx, upstream, outcome, rtt_s, now)
        return response, head

    async def _attempt_failed(
        self,
        exc: BaseException,
        upstream: Upstream,
        send: Send,
        ctx: RequestContext | None,
        source: RequestBodyStream | None,
    ) -> None:
        """No head: the client left, the body was too large, or the upstream failed."""
        if source is not None and source.gone:
            _gone(ctx)
            return
        if source is not None and source.too_large:
            await self._refuse(send, ctx, 413, too_large(self.config.max_body_bytes))
            return
        if source is not None and source.mismatch:
            await self._refuse(send, ctx, 400, _MISMATCH)
            return
        kind = self._kind(exc, ctx)
        self._record(ctx, upstream, OUTCOMES[kind], None)
        await self._failure(send, ctx, kind)

    async def _respond(
        self,
        response: Response,
        head: Head,
        upstream: Upstream,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: RequestContext | None,
        source: RequestBodyStream | None,
    ) -> None:
        status = response.status_code
        headers, length, location = head
        if location and not self.config.preserve_host:
            headers = rewrite_locations(headers, upstream, scope)
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
        except OSError:
            _gone(ctx)
            return
        if scope["method"] == "HEAD" or status in _NO_BODY_STATUSES:
            length = 0
        elif isinstance(response, DirectResponse) and length and length <= UNTIMED_BYTES:
            body = response.stream.arrived(length)
            if body is not None:  # came with the head: one message, no iteration, no watcher
                await self._send_arrived(body, upstream, send, ctx)
                return

        def watch() -> asyncio.Future[Any] | None:
            if source is not None and not source.done:
                return None  # the body is still being read for the upstream
            return asyncio.ensure_future(disconnected(receive))

        try:
            chunks = cast("AsyncIterator[bytes]", response.stream)
            if not await relay(chunks, length, send, self._send_timeout_s, watch):
                _gone(ctx)
            else:
                self.selector.report_body(upstream, True, self.clock())
        except UpstreamBodyError:
            self._count_error(ctx, "protocol")
            self.selector.report_body(upstream, False, self.clock())
            raise
        except ClientSendTimeout:
            if self.metrics is not None:
                self.metrics.client_send_timeouts.inc()
            raise

    async def _send_arrived(
        self, body: bytes, upstream: Upstream, send: Send, ctx: RequestContext | None
    ) -> None:
        """Send a small body that arrived with the head (below ``UNTIMED_BYTES``: no timer)."""
        try:
            await send({"type": "http.response.body", "body": body, "more_body": False})
        except OSError:
            _gone(ctx)
            return
        self.selector.report_body(upstream, True, self.clock())

    def _record(
        self,
        ctx: RequestContext | None,
        upstream: Upstream,
        outcome: AttemptOutcome,
        rtt_s: float | None,
        now: float | None = None,
    ) -> None:
        """Record the attempt's outcome once, before its response head (the proxy/retry seam)."""
        if ctx is not None:
            ctx.record(outcome, rtt_s)
            ctx.tried_upstreams = (*ctx.tried_upstreams, upstream)
        self.selector.report(upstream, outcome, rtt_s, self.clock() if now is None else now)
        if outcome is AttemptOutcome.CONNECT_ERROR:  # rate-limited per upstream (events.py)
            emit("upstream.connect_error", "warning", key=upstream.display, upstream=upstream.display)  # fmt: skip  # noqa: E501

    async def _refuse(
        self, send: Send, ctx: RequestContext | None, status: int, payload: dict[str, object]
    ) -> None:
        """The gateway's own refusal (bad target, body too large): counts as nothing."""
        if ctx is not None:
            ctx.record(AttemptOutcome.GATEWAY_ERROR)
        await send_json(send, status, payload)

    def _timeout_for(self, ctx: RequestContext | None) -> tuple[Timeouts | None, bytes | None]:
        """httpx timeouts and the X-Deadline-Ms value; (None, None) when the deadline passed."""
        if ctx is None or ctx.deadline is None:
            return self._default_timeout, None
        remaining_s = ctx.deadline - self.clock()
        if remaining_s <= 0.0:
            if ctx.would_shed:  # admitted by dry-run: forwarded with 0 ms left
                return self._default_timeout, b"0"
            return None, None
        header = str(int(remaining_s * 1000.0)).encode("ascii")
        timeouts = _timeouts(remaining_s, self.config)
        timeouts["total"] = remaining_s
        return timeouts, header

    def _kind(self, exc: BaseException, ctx: RequestContext | None) -> str:
        """``deadline`` when a timeout only enforced the request's own budget."""
        kind = kind_of(exc)
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
        status, payload = ERROR_BODIES[kind]
        await send_json(send, status, payload)

    def _count_error(self, ctx: RequestContext | None, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(kind).inc()


_MISMATCH: dict[str, object] = {
    "error": "bad_request",
    "message": "the request body is not the length its head declared",
    "header": "Content-Length",
}


def _head(scope: Scope, ctx: RequestContext | None) -> RequestHead:
    """The request head as admission parsed it, or parsed here (same rules) without admission."""
    if ctx is not None and ctx.head is not NO_HEAD:
        return ctx.head
    return read_head(scope["headers"], _FRAMING_ONLY, scope["method"])


def _length_header(length: int) -> tuple[bytes, bytes]:
    return (_CONTENT_LENGTH, str(length).encode("ascii"))


def _gone(ctx: RequestContext | None) -> None:
    if ctx is not None:
        ctx.record(AttemptOutcome.CLIENT_GONE)  # a no-op once the head was recorded


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
