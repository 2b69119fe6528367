"""The terminal reverse proxy: a raw ASGI app that forwards to the chosen upstream.

The proxy contract (tested in tests/proxy/test_proxy*.py; docs/proxying.md
says it for users), by module:

* Target and framing from the one parse of the head: ``ctx.head`` (admission
  checked the target and read the head once, ``core/head.py``), or, with no
  admission stage, ``origin_form`` and ``read_head`` here with the same
  refusals. Only origin-form targets are proxied; the upstream URL is built
  from the parsed upstream's parts and the target (``upstream.py``). The
  client's ``Content-Length``/``Transfer-Encoding`` are never forwarded: the
  proxy writes the length of a read body (one that is not its declared length
  is a 400), the declared length of a streamed one (held to it), or ``chunked``.
* Headers (``headers.py``): hop-by-hop and ``Expect`` removed both ways,
  ``Host`` the upstream's (or the client's, ``preserve_host``, from the head),
  ``X-Forwarded-*`` set, nothing else added.
* Bodies (``body.py``): up to ``request_buffer_bytes`` read first, a larger or
  chunked one streamed; above ``max_body_bytes`` 413. The call (``calls.py``,
  over the shared client of ``client.py``) is bounded by the request's deadline
  (``X-Deadline-Ms`` carries what remains; 504 when nothing does) or ``timeout_ms``.
* The attempt's ``AttemptOutcome`` and time to the head are recorded on the
  context once, before the head is sent, and reported to the selector.
* Failures (``failures.py``): timeouts 504, connect and protocol errors 502; a
  response head the gateway cannot relay faithfully
  (``headers.response_head``) is a protocol error, refused before any byte.
* The response (``respond.py``): streamed back with backpressure; a slow
  client or a failure mid-body aborts the connection.
* A client that leaves (under the gateway's own server): the wait for the
  upstream's head or body is cancelled (``ResponseCycle.stop``, registered as
  the cycle's ``on_gone``), the upstream connection closed, ``client_gone``.

Longer than 320 lines on purpose: one attempt is inline in ``__call__`` (no
coroutine per layer on the common path, issue 18), which the lane
(``gateway/lane.py``, ``laned.py``) follows step by step.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.head import NO_HEAD, HeadLimits, read_head
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Clock, Receive, Scope, Send
from ballast_asgi.middleware.context import LEAVING, RequestContext, find_context
from ballast_asgi.middleware.responses import send_refusal
from ballast_asgi.proxy.body import (
    BodyMismatch,
    BodyTooLarge,
    ClientGone,
    RequestBodyStream,
    read_body,
)
from ballast_asgi.proxy.calls import (
    deadline_timeouts,
    direct_call,
    httpx_request,
    record_attempt,
    timeouts,
)
from ballast_asgi.proxy.client import SharedClient
from ballast_asgi.proxy.failures import (
    BAD_TARGET,
    MISMATCH,
    OUTCOMES,
    failure_kind,
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
from ballast_asgi.proxy.redirects import client_host
from ballast_asgi.proxy.respond import Relay, gone
from ballast_asgi.proxy.server import drop_request_trailers
from ballast_asgi.proxy.transports import DirectResponse
from ballast_asgi.proxy.transports.aiohttp_transport import client_timeout
from ballast_asgi.proxy.transports.lean_wire import LeanResponse
from ballast_asgi.proxy.upstream import Selector, SingleUpstream, Upstream
from ballast_asgi.telemetry.metrics import Metrics

#: The head checks of a proxy without an admission stage: framing only, no size bounds.
_FRAMING_ONLY = HeadLimits(max_headers=0, max_header_bytes=0)
_CONTENT_LENGTH = b"content-length"
_CHUNKED = (b"transfer-encoding", b"chunked")
#: What the wait for an upstream head ends with, other than a head (``_attempt_failed``).
_NO_HEAD = (httpx.TransportError, TimeoutError, ClientGone, BodyTooLarge, BodyMismatch)


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
        #: The shared upstream client (opened at startup or on first use).
        self.connections = SharedClient(config, transport)
        self._relay = Relay(config, metrics, clock)
        self._default_timeout = timeouts(config.timeout_ms / 1000.0, config)
        #: aiohttp's form of it, built once (requests without a deadline all use it).
        self._default_limits = client_timeout(self._default_timeout)
        self._max_headers = config.max_response_headers
        self._max_head_bytes = config.max_response_head_bytes
        drop_request_trailers()  # before uvicorn parses a request: trailers are not headers

    # -- lifecycle ------------------------------------------------------------
    @property
    def client(self) -> httpx.AsyncClient:
        """The shared client (created on first use when lifespan never ran)."""
        return self.connections.client

    async def startup(self) -> None:
        """Create the shared client (idempotent)."""
        await self.connections.startup()

    async def aclose(self) -> None:
        """Close the shared client and its transport (idempotent)."""
        await self.connections.aclose()

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            raise RuntimeError(f"ProxyApp serves http only, not {scope['type']!r}")
        await self.connections.lifespan(receive, send)

    # -- requests -------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Forward one HTTP request (the body of the call: no extra coroutine per request)."""
        if scope["type"] != "http":
            await self._not_http(scope, receive, send)
            return
        ctx = find_context(scope)
        source: RequestBodyStream | None = None
        prefetched = None if ctx is None else ctx.prefetched
        if prefetched is not None:  # sent by the lane (``gateway/lane.py``): its result
            ctx.prefetched = None  # type: ignore[union-attr]
            upstream, call, started = prefetched
            host = ctx.head.host  # type: ignore[union-attr]
            head_s = None
            selector = self.selector
        else:
            if ctx is not None and ctx.head is not NO_HEAD:
                head = ctx.head  # admission checked the target and read the head, once
            elif not origin_form(scope):
                await self._relay.refuse(send, ctx, 400, BAD_TARGET)
                return
            else:
                try:  # no admission stage: the one parser, with the same refusals
                    head = read_head(scope["headers"], _FRAMING_ONLY, scope["method"])
                except HeaderError as exc:
                    if ctx is not None:
                        ctx.record(AttemptOutcome.GATEWAY_ERROR)
                    await send_refusal(send, exc)
                    return
            length = head.content_length
            limit = self.config.max_body_bytes
            if length is not None and length > limit:
                await self._relay.refuse(send, ctx, 413, too_large(limit))
                return
            headers = request_headers(scope, ctx is not None and ctx.deadline is not None)
            if head.chunked or (length is not None and length > self.config.request_buffer_bytes):
                source = RequestBodyStream(receive, limit, length)  # held to exactly ``length``
                headers.append(_CHUNKED if length is None else _length_header(length))
                stream: httpx.AsyncByteStream | bytes = source
            else:
                message = await receive()  # the common case: the whole body in one message
                if message["type"] == "http.request" and not message.get("more_body", False):
                    body = message.get("body", b"")
                    if len(body) > limit:
                        body = None
                else:
                    try:
                        body = await read_body(receive, limit, message)
                    except ClientGone:
                        gone(ctx)
                        return
                if body is None:
                    await self._relay.refuse(send, ctx, 413, too_large(limit))
                    return
                if length is not None and len(body) != length:
                    await self._relay.refuse(send, ctx, 400, MISMATCH)
                    return
                if body or length is not None:  # framed by the bytes read, whatever was sent
                    headers.append(_length_header(len(body)))
                stream = body
            host = head.host
            timeout, deadline_ms = deadline_timeouts(ctx, self.clock, self.config,
                                                     self._default_timeout)  # fmt: skip
            if timeout is None:
                if ctx is not None:
                    ctx.record(AttemptOutcome.DEADLINE)
                await self._relay.failure(send, "deadline")
                return
            if deadline_ms is not None:
                headers.append((DEADLINE, deadline_ms))
            tried: tuple[object, ...] = () if ctx is None else ctx.tried_upstreams
            selector = self.selector
            upstream = selector.choose(ctx, tried)  # type: ignore[arg-type]  # (no cast call)
            public = client_host(scope, host) if self.config.preserve_host else None
            headers.insert(0, (b"host", public or upstream.netloc))
            limits = self._default_limits if timeout is self._default_timeout else None
            connections = self.connections
            call = direct_call(
                connections.direct, scope, upstream, headers, stream, timeout, limits
            )
            if call is None:
                request = httpx_request(scope, upstream, headers, stream, timeout, source)
                call = connections.send_httpx(request)
            bounded = "total" in timeout and not connections.bounds_total
            head_s = timeout["read"] if bounded else None
            started = self.clock()
        # The attempt, up to the checked response head (bounded by ``head_s``), recorded
        # once; a head ``response_head`` refuses is a protocol error (502). Inline: no
        # coroutine per layer on the common path.
        cycle = LEAVING.get()  # our server's cycle: a client that leaves cancels the wait
        if cycle is not None:  # for the upstream (its head or body): ``ResponseCycle.stop``
            if cycle.disconnected:  # gone already (the lane handed it on): at the first wait
                cycle.stop()
            else:
                cycle.on_gone = cycle.stop
        try:
            try:
                if head_s is None:
                    response = await call
                else:
                    async with asyncio.timeout(head_s):
                        response = await call
            except _NO_HEAD as exc:
                await self._attempt_failed(exc, upstream, send, ctx, source)
                return
            status = response.status_code
            direct = isinstance(response, DirectResponse)
            raw = response.raw_headers if direct else response.headers.raw
            try:
                checked = getattr(response, "values_checked", False)
                relayed = response_head(status, raw, self._max_headers, self._max_head_bytes,
                                        not checked)  # fmt: skip
            except BadResponseHead as exc:
                await response.aclose()  # not read: the upstream connection is closed
                await self._attempt_failed(exc, upstream, send, ctx, source)
                return
            now = self.clock()
            rtt_s = now - started
            if self.metrics is not None:
                self.metrics.observe_upstream_latency(rtt_s)
            outcome = status_outcome(status) if ctx is None else ctx.status_outcome(status)
            record_attempt(self.selector, self.clock, ctx, upstream, outcome, rtt_s, now)
            try:
                await self._relay.respond(selector, response, relayed, upstream, scope, receive,
                                          send, ctx, source, host)  # fmt: skip
            finally:
                if isinstance(response, LeanResponse):
                    response.abort()  # what its ``aclose`` does, without a coroutine
                else:
                    await response.aclose()
        except asyncio.CancelledError:
            if cycle is None or not cycle.took_back():
                raise
            gone(ctx)  # the client left (the exchange closed its connection)
        finally:
            if cycle is not None:
                cycle.on_gone = None

    async def _attempt_failed(
        self,
        exc: BaseException,
        upstream: Upstream,
        send: Send,
        ctx: RequestContext | None,
        source: RequestBodyStream | None,
    ) -> None:
        """No head: the client left, the body was too large, or the upstream failed."""
        if (source is not None and source.gone) or exc.__class__ is ClientGone:
            gone(ctx)
            return
        if source is not None and source.too_large:
            await self._relay.refuse(send, ctx, 413, too_large(self.config.max_body_bytes))
            return
        if source is not None and source.mismatch:
            await self._relay.refuse(send, ctx, 400, MISMATCH)
            return
        kind = failure_kind(exc, None if ctx is None else ctx.deadline, self.clock)
        record_attempt(self.selector, self.clock, ctx, upstream, OUTCOMES[kind], None)
        await self._relay.failure(send, kind)


def _length_header(length: int) -> tuple[bytes, bytes]:
    return (_CONTENT_LENGTH, str(length).encode("ascii"))


__all__ = ["ProxyApp"]
