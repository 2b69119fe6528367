"""The proxy's response side: relay the upstream's checked head and body to the client.

The head is sent as ``headers.response_head`` checked it, with Location and
Content-Location moved to the gateway's address (``redirects.py``, unless
``preserve_host``). A body that came whole with the head (our direct
transports, at most ``UNTIMED_BYTES``) is one message with no timer; any other
streams with backpressure (``body.relay``): a client that takes no data for
``send_timeout_ms`` and an upstream failure mid-body abort the client
connection (raise), never a complete-looking response. The body's fate is
reported to the selector; a client gone is recorded on the context. The
proxy's own answers go out here too: ``refuse`` (bad target, body too large:
counts as nothing) and ``failure`` (502/504 from ``failures.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Clock, RawHeaders, Receive, Scope, Send
from ballast_asgi.middleware.context import RequestContext
from ballast_asgi.middleware.responses import send_json
from ballast_asgi.proxy.body import (
    UNTIMED_BYTES,
    ClientSendTimeout,
    RequestBodyStream,
    UpstreamBodyError,
    disconnected,
    relay,
)
from ballast_asgi.proxy.calls import Response
from ballast_asgi.proxy.failures import ERROR_BODIES
from ballast_asgi.proxy.redirects import rewrite_locations
from ballast_asgi.proxy.transports import DirectResponse
from ballast_asgi.proxy.upstream import Selector, SingleUpstream, Upstream
from ballast_asgi.telemetry.metrics import Metrics

_NO_BODY_STATUSES = frozenset({204, 304})
#: The response head as relayed: headers, Content-Length (None: unknown), has a Location.
Head = tuple[RawHeaders, int | None, bool]


class Relay:
    """Sends one attempt's response to the client."""

    def __init__(self, config: ProxyConfig, metrics: Metrics | None, clock: Clock) -> None:
        self._preserve_host = config.preserve_host
        self._send_timeout_s = config.send_timeout_ms / 1000.0
        self._metrics = metrics
        self._clock = clock

    async def respond(
        self,
        selector: Selector,
        response: Response,
        head: Head,
        upstream: Upstream,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: RequestContext | None,
        source: RequestBodyStream | None,
        host: bytes | None,
    ) -> None:
        """The head, then the body (``host``: the request's ``Host``, from its head)."""
        status = response.status_code
        headers, length, location = head
        if location and not self._preserve_host:
            headers = rewrite_locations(headers, upstream, scope, host)
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
        except OSError:
            gone(ctx)
            return
        if scope["method"] == "HEAD" or status in _NO_BODY_STATUSES:
            length = 0
        elif isinstance(response, DirectResponse) and length and length <= UNTIMED_BYTES:
            body = response.stream.arrived(length)
            if body is not None:  # came with the head: one message, no iteration, no watcher
                try:  # below ``UNTIMED_BYTES``: no timer
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                except OSError:
                    gone(ctx)
                    return
                if type(selector) is not SingleUpstream:  # its reports are no-ops: no clock
                    selector.report_body(upstream, True, self._clock())
                return

        def watch() -> asyncio.Future[Any] | None:
            if source is not None and not source.done:
                return None  # the body is still being read for the upstream
            return asyncio.ensure_future(disconnected(receive))

        try:
            chunks = cast("AsyncIterator[bytes]", response.stream)
            if not await relay(chunks, length, send, self._send_timeout_s, watch):
                gone(ctx)
            else:
                selector.report_body(upstream, True, self._clock())
        except UpstreamBodyError:
            if self._metrics is not None:
                self._metrics.upstream_errors.labels("protocol").inc()
            selector.report_body(upstream, False, self._clock())
            raise
        except ClientSendTimeout:
            if self._metrics is not None:
                self._metrics.client_send_timeouts.inc()
            raise

    async def refuse(
        self, send: Send, ctx: RequestContext | None, status: int, payload: dict[str, object]
    ) -> None:
        """The gateway's own refusal (bad target, body too large): counts as nothing."""
        if ctx is not None:
            ctx.record(AttemptOutcome.GATEWAY_ERROR)
        await send_json(send, status, payload)

    async def failure(self, send: Send, kind: str) -> None:
        """The one place an upstream failure becomes a response (502 or 504)."""
        if self._metrics is not None:
            self._metrics.upstream_errors.labels(kind).inc()
        status, payload = ERROR_BODIES[kind]
        await send_json(send, status, payload)


def gone(ctx: RequestContext | None) -> None:
    """The client left: the attempt's outcome, unless one was recorded already."""
    if ctx is not None:
        ctx.record(AttemptOutcome.CLIENT_GONE)  # a no-op once the head was recorded


__all__ = ["Head", "Relay", "gone"]
