"""The one place that writes a shed or error response.

A shed answer carries its reason's status (overload sheds 429, unavailability
sheds such as ``breaker_open`` 503, both configurable per reason), ``Retry-After`` in
whole seconds (>= 1), ``X-Ballast-Reason`` and a small JSON body. Retry-After
comes from the current drain estimate (seconds until the queue would empty at
recent throughput) with +/-``jitter`` so that clients do not come back in
lockstep; a ``Shed`` may carry an explicit value (e.g. the breaker's open time).
Every stage hands its ``Shed`` decision (``core/shed.py``) to ``act``, which
alone knows about dry-run.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence

from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.outcome import ShedReason, shed_statuses
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.shed import Shed, ShedHeaders
from ballast_asgi.core.types import ASGIApp, Receive, Scope, Send
from ballast_asgi.middleware.context import RequestContext
from ballast_asgi.telemetry.metrics import Metrics

_JSON = (b"content-type", b"application/json")
_NO_STORE = (b"cache-control", b"no-store")
#: A shed response built once: its headers and body.
_Built = tuple[ShedHeaders, bytes]


async def send_json(
    send: Send,
    status: int,
    payload: dict[str, object],
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a complete JSON response (start + body) in two messages."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = [_JSON, _NO_STORE, (b"content-length", str(len(body)).encode())]
    if extra_headers:
        headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_ERRORS = {
    400: "bad_request",
    405: "method_not_allowed",
    413: "payload_too_large",
    431: "headers_too_large",
    501: "not_implemented",
}


async def send_refusal(send: Send, exc: HeaderError) -> None:
    """The answer a refused request head gets (400, 405, 413, 431 or 501), naming the header."""
    payload: dict[str, object] = {
        "error": _ERRORS.get(exc.status, "bad_request"),
        "message": str(exc),
        "header": exc.header,
    }
    await send_json(send, exc.status, payload, [(b"connection", b"close")])


class ShedResponder:
    """Writes shed responses and counts them; shared by every stage."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        status: int = 429,
        status_by_reason: Mapping[ShedReason, int] | None = None,
        jitter: float = 0.25,
        max_retry_after_s: int = 60,
        rng: random.Random | None = None,
    ) -> None:
        self.metrics = metrics
        self._by_reason: dict[ShedReason, int] = dict(status_by_reason or {})
        self.statuses: dict[ShedReason, int] = {}
        self.status = status
        self.jitter = jitter
        self.max_retry_after_s = max_retry_after_s
        self._rng = rng or random.Random()
        #: Seconds until the backlog would drain; wired by the composition root.
        self.drain_estimate: Callable[[], float] = lambda: 1.0
        #: Dry-run: ``act`` admits what it would shed and counts it instead.
        #: Set by the composition root; flipped live on reload.
        self.dry_run = False
        self._built: dict[tuple[ShedReason, Priority, int], _Built] = {}
        #: ``metrics.count_shed`` by (reason, tier), bound once.
        self._count_shed = metrics.shed_adders

    @property
    def status(self) -> int:
        """The overload sheds' status (default 429)."""
        return self._status

    @status.setter
    def status(self, status: int) -> None:
        self.set_statuses(status, self._by_reason)

    def set_statuses(self, status: int, by_reason: Mapping[ShedReason, int] | None) -> None:
        """The overload status and the per-reason ones (``shed.status_by_reason``)."""
        statuses = shed_statuses(status, by_reason)
        bad = {r.value: s for r, s in statuses.items() if not 400 <= s <= 599}
        if bad or not 400 <= status <= 599:
            raise ValueError(f"shed status must be in 400..599, got {status} {bad or ''}".strip())
        self._status = status
        self._by_reason = dict(by_reason or {})
        self.statuses = statuses

    def retry_after_s(self) -> int:
        """Whole seconds >= 1: the drain estimate with jitter, capped."""
        base = max(1.0, self.drain_estimate())
        jittered = base * (1.0 + self._rng.uniform(-self.jitter, self.jitter))
        return max(1, min(self.max_retry_after_s, math.ceil(jittered)))

    @staticmethod
    def priority_of(ctx: RequestContext | None) -> Priority:
        """The request's tier (STANDARD when no admission stage classified it)."""
        return Priority.STANDARD if ctx is None else ctx.priority

    def count_would_shed(
        self, ctx: RequestContext | None, reason: ShedReason, priority: Priority
    ) -> None:
        """Dry-run: count a request enforcement would shed and note why on its context.

        A context with a non-empty ``would_shed`` runs outside every later limit
        (no queue slot, permit, capacity slot or breaker ticket), so it is counted
        once, under the first stage that would have shed it (a later reason is
        only noted on the context).
        """
        if ctx is None or not ctx.would_shed:
            self.metrics.count_would_shed(reason, priority)
        if ctx is not None:
            ctx.would_shed.append(reason)

    async def act(
        self,
        shed: Shed,
        ctx: RequestContext | None,
        app: ASGIApp,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Every stage's shed point: answer ``shed``, or (dry-run) count it and run ``app``.

        Enforcing: ``ctx.shed_reason`` is set and the shed response sent; ``app``
        is not called. Dry-run: the request is counted as a would-be shed, marked
        (``ctx.would_shed``: it runs outside every later limit) and ``app`` runs
        with the stage's ``scope``, ``receive`` and ``send``, as if admitted.
        """
        if self.dry_run:
            self.count_would_shed(ctx, shed.reason, shed.priority)
            await app(scope, receive, send)
            return
        if ctx is not None:
            ctx.shed_reason = shed.reason
        await self.shed(send, shed)

    async def shed(self, send: Send, shed: Shed) -> None:
        """Count and send one shed response (whatever the dry-run setting).

        The head and body of a shed without extra headers are built once per
        (status, reason, tier, Retry-After) and reused (issue 18: a shed's own
        work is the two messages and one counter); with extra headers (the rate
        limit's) they are built each time, byte for byte the same way.
        """
        status, _, headers, body = self.response(shed)
        await send({"type": "http.response.start", "status": status, "headers": list(headers)})
        await send({"type": "http.response.body", "body": body})

    def response(self, shed: Shed) -> tuple[int, int, ShedHeaders, bytes]:
        """Count ``shed``; its status, Retry-After seconds, headers and JSON body.

        What ``shed`` sends, and what the shed at the wire (``ballast_asgi/server/wire.py``)
        writes as bytes: the one definition of a shed response.
        """
        reason = shed.reason
        priority = shed.priority
        self._count_shed[reason, priority](1)  # ``metrics.count_shed``
        after = shed.retry_after_s
        if after is None:  # ``retry_after_s()``, inlined (the same draw, the same value)
            base = self.drain_estimate()
            if not base >= 1.0:  # ``max(1.0, base)``
                base = 1.0
            jitter = self.jitter
            # ``Random.uniform(-jitter, jitter)``: ``a + (b - a) * random()``
            jittered = base * (1.0 + (-jitter + (jitter + jitter) * self._rng.random()))
            seconds = math.ceil(jittered)
            if seconds > self.max_retry_after_s:
                seconds = self.max_retry_after_s
            if seconds < 1:
                seconds = 1
        else:
            seconds = math.ceil(after)
            if seconds < 1:
                seconds = 1
        if shed.headers:
            headers, body = _shed_response(reason, priority, seconds, shed.headers)
        else:
            key = (reason, priority, seconds)
            built = self._built.get(key)
            if built is None:
                built = _shed_response(reason, priority, seconds, ())
                if len(self._built) < _BUILT_MAX:
                    self._built[key] = built
            headers, body = built
        return self.statuses[reason], seconds, headers, body


#: Shed responses kept built (reasons x tiers x Retry-After values seen; bounded).
_BUILT_MAX = 4096


def _shed_response(
    reason: ShedReason,
    priority: Priority,
    seconds: int,
    extra: Sequence[tuple[bytes, bytes]],
) -> tuple[tuple[tuple[bytes, bytes], ...], bytes]:
    """A shed response's headers and JSON body (what ``send_json`` would send)."""
    payload: dict[str, object] = {
        "error": "shed",
        "reason": reason.value,
        "priority": priority.label,
        "retry_after_s": seconds,
    }
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = (
        _JSON,
        _NO_STORE,
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(seconds).encode()),
        (b"x-ballast-reason", reason.value.encode()),
        *extra,
    )
    return headers, body
