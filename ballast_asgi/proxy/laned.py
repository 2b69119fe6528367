"""The proxy's part of the lane (ADR 0020): ``ProxyApp``'s steps for the lane's request.

The lane (``gateway/lane.py``) serves the common proxied request from the
server protocol with callbacks. Its proxy steps are ``ProxyApp.__call__``'s
for a request without a body, to the one upstream, on the lean transport,
taken in two halves around the upstream's answer:

* ``begin``: the upstream request built as the proxy builds it (the same
  headers: hop-by-hop dropped, ``X-Forwarded-*``, ``Host``, the remaining
  budget as ``X-Deadline-Ms``, ``Content-Length: 0`` when the client declared
  one) and written on an idle pooled connection (``LeanTransport.begin``);
  None, with nothing sent, when the proxy's own way must carry it (no lean
  transport, an https upstream, the deadline already spent, a head with CR or
  LF, no idle connection);
* ``check``: at the response head, whether it is the common answer: a final
  head ``response_head`` accepts, with a Content-Length of 0 to
  ``UNTIMED_BYTES`` or no body at all (HEAD, 204, 304) (the proxy sends such a
  body as one message, with no timer, once it is in; the lane waits for it in
  callbacks);
* ``answer``: once that body is in, what the proxy would send, recorded as the
  proxy records it (``upstream_latency`` and the limiter's sample are the time
  to the head, ``ctx.record``, the upstreams tried).

Anything else (a head the proxy refuses, a body to stream, a retryable failure
while the request may retry) is None, with nothing recorded and nothing taken:
the proxy then does it all itself, from the same result (``ctx.prefetched``).
"""

from __future__ import annotations

from collections.abc import Callable

from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import RawHeaders, Scope
from ballast_asgi.middleware.context import RequestContext
from ballast_asgi.proxy.app import ProxyApp, _length_header
from ballast_asgi.proxy.body import UNTIMED_BYTES
from ballast_asgi.proxy.calls import deadline_timeouts, record_attempt
from ballast_asgi.proxy.headers import (
    DEADLINE,
    BadResponseHead,
    raw_target,
    request_headers,
    response_head,
)
from ballast_asgi.proxy.redirects import client_host, rewrite_locations
from ballast_asgi.proxy.transports.lean import LeanTransport, lean_limits
from ballast_asgi.proxy.transports.lean_wire import LeanResponse
from ballast_asgi.proxy.upstream import SingleUpstream, Upstream

_SUCCESS = AttemptOutcome.SUCCESS
_NO_BODY = (204, 304)
#: The lane's callback (``LeanResponse``'s ``notify``).
Told = Callable[..., None]
#: A response head the lane answers: status, relayed headers, Content-Length, a Location.
Checked = tuple[int, RawHeaders, int, bool]
#: One exchange: the response, its upstream, the proxy's clock when sent and at the head.
Exchange = tuple[LeanResponse, Upstream, float, float]


class LanedProxy:
    """``ProxyApp``'s steps for a request the lane serves (see the module)."""

    __slots__ = ("app", "upstream")

    def __init__(self, app: ProxyApp) -> None:
        self.app = app
        #: The one upstream (None: a selector that chooses: the lane leaves those alone).
        self.upstream: Upstream | None = (
            app.upstream if type(app.selector) is SingleUpstream else None
        )

    def ready(self) -> bool:
        """Whether a request could be begun now (cheap: before the stages count anything)."""
        lean = self.app.connections.direct
        return self.upstream is not None and type(lean) is LeanTransport and lean.has_idle()

    def begin(
        self, scope: Scope, ctx: RequestContext, told: Told
    ) -> tuple[LeanResponse, Upstream, float] | None:
        """The request sent: its exchange, the upstream and the proxy's clock then; None
        with nothing sent (see the module)."""
        app = self.app
        lean = app.connections.direct
        upstream = self.upstream
        if type(lean) is not LeanTransport or upstream is None:
            return None
        head = ctx.head
        headers = request_headers(scope, ctx.deadline is not None)
        if head.content_length is not None:  # declared (0: no body): framed by what is sent
            headers.append(_length_header(0))
        default = app._default_timeout
        timeout, deadline_ms = deadline_timeouts(ctx, app.clock, app.config, default)
        if timeout is None:
            return None  # the proxy records DEADLINE and answers 504
        if deadline_ms is not None:
            headers.append((DEADLINE, deadline_ms))
        public = client_host(scope, head.host) if app.config.preserve_host else None
        headers.insert(0, (b"host", public or upstream.netloc))
        limits = app._default_limits if timeout is default else lean_limits(timeout)
        started = app.clock()
        response = lean.begin(scope["method"], upstream, raw_target(scope), headers, limits, told)
        return None if response is None else (response, upstream, started)

    def check(self, scope: Scope, response: LeanResponse) -> Checked | None:
        """The response head as the proxy would relay it, when the lane can answer it: a
        final head ``response_head`` accepts with a Content-Length of 0 to
        ``UNTIMED_BYTES`` (the proxy sends such a body as one message), or a head with no
        body at all (to a HEAD, a 204 or a 304: the proxy sends an empty last message);
        None: the ASGI path answers it (a body to stream, chunked or close-delimited)."""
        status = response.status_code
        app = self.app
        try:
            headers, length, location = response_head(
                status, response.raw_headers, app._max_headers, app._max_head_bytes, False
            )
        except BadResponseHead:
            return None
        if status in _NO_BODY or scope["method"] == "HEAD":
            length = 0  # whatever the head says (``Relay.respond``'s rule)
        elif length is None or length > UNTIMED_BYTES:
            return None
        return status, headers, length, location

    def answer(
        self,
        scope: Scope,
        ctx: RequestContext,
        exchange: Exchange,
        checked: Checked,
        retrying: bool,
    ) -> tuple[int, RawHeaders, bytes] | None:
        """The answer once its whole body is in, recorded as the proxy records it; None
        (nothing recorded): a retryable outcome while the request may retry."""
        response, upstream, started, head_at = exchange
        status, headers, length, location = checked
        outcome = ctx.status_outcome(status)
        if retrying and outcome is not _SUCCESS:
            return None  # the retry stage decides at this head: the ASGI path's ``Attempt``
        app = self.app
        rtt_s = head_at - started
        if app.metrics is not None:
            app.metrics.observe_upstream_latency(rtt_s)
        record_attempt(app.selector, app.clock, ctx, upstream, outcome, rtt_s, head_at)
        if location and not app.config.preserve_host:
            headers = rewrite_locations(headers, upstream, scope, ctx.head.host)
        body = response.arrived(length)
        assert body is not None  # complete, and llhttp held it to its Content-Length
        return status, headers, body


__all__ = ["LanedProxy"]
