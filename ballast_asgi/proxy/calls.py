"""The upstream call of one attempt: direct on our own transports, else through httpx.

``direct_call`` is the common case (issue 18 item 4): a request body already
in memory goes without ``httpx.Request``/``URL``/``Response`` objects, on the
lean transport (``LeanTransport.send_lean``: plain-http upstreams, header
bytes as they are) or else on aiohttp (``AiohttpTransport.send_direct``:
UTF-8 header values). Everything else (a streamed body, a header value that is not UTF-8,
an injected transport such as ``httpx.MockTransport`` or respx, httpx's own
pool) is an ``httpx.Request`` through the transport's ``handle_async_request``.
Both send the same bytes and raise the same httpx errors.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import httpx
from aiohttp import ClientTimeout

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Clock, RawHeaders, Scope
from ballast_asgi.middleware.context import RequestContext
from ballast_asgi.proxy.headers import raw_target
from ballast_asgi.proxy.transports.aiohttp_transport import (
    AiohttpTransport,
    client_timeout,
    decode_headers,
    direct_url,
)
from ballast_asgi.proxy.transports.direct import DirectResponse
from ballast_asgi.proxy.transports.lean import LeanTransport, lean_limits
from ballast_asgi.proxy.upstream import Selector, SingleUpstream, Upstream
from ballast_asgi.telemetry.events import emit

#: httpx's ``timeout`` request extension (plus ``total`` for the aiohttp transport).
Timeouts = dict[str, Any]
#: An upstream response head: httpx's, or the aiohttp transport's direct one.
Response = httpx.Response | DirectResponse


def timeouts(seconds: float, config: ProxyConfig) -> Timeouts:
    """httpx's timeouts for an attempt with ``seconds`` to go (connect capped by the config)."""
    connect = min(seconds, config.connect_timeout_ms / 1000.0)
    return {"connect": connect, "read": seconds, "write": seconds, "pool": seconds}


def deadline_timeouts(
    ctx: RequestContext | None, clock: Clock, config: ProxyConfig, default: Timeouts
) -> tuple[Timeouts | None, bytes | None]:
    """The attempt's timeouts and X-Deadline-Ms value; (None, None) when the deadline passed.

    ``default`` without a deadline; a request dry-run admitted (``ctx.would_shed``)
    whose deadline passed is forwarded with 0 ms left under ``default``.
    """
    if ctx is None or ctx.deadline is None:
        return default, None
    remaining_s = ctx.deadline - clock()
    if remaining_s <= 0.0:
        if ctx.would_shed:
            return default, b"0"
        return None, None
    header = str(int(remaining_s * 1000.0)).encode("ascii")
    out = timeouts(remaining_s, config)
    out["total"] = remaining_s
    return out, header


def direct_call(
    direct: AiohttpTransport | None,
    scope: Scope,
    upstream: Upstream,
    headers: RawHeaders,
    body: httpx.AsyncByteStream | bytes,
    timeout: Timeouts,
    limits: ClientTimeout | None = None,
) -> Awaitable[Response] | None:
    """The upstream call without httpx objects, or None when the httpx seam must carry it.

    ``limits``: ``timeout`` already in aiohttp's form (the proxy builds its default once).
    """
    if direct is None or not isinstance(body, bytes):
        return None
    if isinstance(direct, LeanTransport):
        lean = direct.send_lean(
            scope["method"],
            upstream,
            raw_target(scope),
            headers,
            body,
            lean_limits(timeout) if limits is None else limits,
        )
        if lean is not None:
            return lean
    text = decode_headers(headers)
    if text is None:  # not UTF-8: the transport's httpx pool keeps the bytes
        return None
    url = direct_url(upstream, raw_target(scope))
    limits = client_timeout(timeout) if limits is None else limits
    return direct.send_direct(scope["method"], url, text, body, limits)


def record_attempt(
    selector: Selector,
    clock: Clock,
    ctx: RequestContext | None,
    upstream: Upstream,
    outcome: AttemptOutcome,
    rtt_s: float | None,
    now: float | None = None,
) -> None:
    """Record an attempt's outcome once, before its response head (the proxy/retry seam):
    on the request's context, and to the selector (the proxy's and the lane's)."""
    if ctx is not None:
        ctx.record(outcome, rtt_s)
        ctx.tried_upstreams = (*ctx.tried_upstreams, upstream)
    if type(selector) is not SingleUpstream:  # its reports are no-ops
        selector.report(upstream, outcome, rtt_s, clock() if now is None else now)
    if outcome is AttemptOutcome.CONNECT_ERROR:  # rate-limited per upstream (events.py)
        emit("upstream.connect_error", "warning", key=upstream.display, upstream=upstream.display)


def httpx_request(
    scope: Scope,
    upstream: Upstream,
    headers: RawHeaders,
    stream: httpx.AsyncByteStream | bytes,
    timeout: Timeouts,
    streamed: object | None,
) -> httpx.Request:
    """The attempt as an ``httpx.Request`` (read into memory unless ``streamed``)."""
    request = httpx.Request(
        scope["method"],
        upstream.url(raw_target(scope)),
        headers=headers,
        stream=httpx.ByteStream(stream) if isinstance(stream, bytes) else stream,
        extensions={"timeout": timeout},
    )
    if streamed is None:
        request.read()
    return request


__all__ = [
    *("Response", "Timeouts", "deadline_timeouts", "direct_call", "httpx_request"),
    *("record_attempt", "timeouts"),
]
