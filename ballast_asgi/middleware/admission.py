"""AdmissionMiddleware: parse the tier and deadline, drop the dead on arrival.

The outermost shedding stage. For each HTTP request it

1. parses ``X-Priority`` and ``X-Deadline-Ms`` (400 naming the header when malformed);
2. lets the ``Classifier`` (when given) choose the tier: a trusted ``X-Priority``,
   else consumer key, path rules and the default; an untrusted header is ignored
   (counted in ``ballast_priority_header_ignored_total``), not validated;
3. sheds with ``deadline`` a request whose budget is already spent, and with
   ``early_drop`` one that cannot make its deadline (when an estimator is given);
4. otherwise creates the ``RequestContext`` and calls the inner app with it in scope.

Dry-run (``responder.dry_run``): a request step 3 would shed is counted in
``ballast_dry_run_shed_total`` and admitted; a dead-on-arrival one goes upstream
with ``X-Deadline-Ms: 0``. A malformed header is still a 400 (not a shed).
"""

from __future__ import annotations

import time
from typing import Protocol

from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.deadline import DEADLINE_HEADER, absolute_deadline
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import PRIORITY_HEADER, Priority, parse_priority
from ballast_asgi.core.types import ASGIApp, Clock, Receive, Scope, Send
from ballast_asgi.metrics import Metrics
from ballast_asgi.middleware.context import RequestContext, with_context
from ballast_asgi.middleware.responses import ShedResponder, send_bad_request


class EarlyDrop(Protocol):
    """Decides whether a request can still make its deadline."""

    def should_drop(self, remaining_s: float, priority: Priority, now: float) -> bool: ...


class AdmissionMiddleware:
    """Deadline admission and request classification."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        responder: ShedResponder,
        metrics: Metrics,
        default_priority: Priority = Priority.STANDARD,
        default_deadline_ms: float | None = None,
        classifier: Classifier | None = None,
        early_drop: EarlyDrop | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if default_deadline_ms is not None and default_deadline_ms <= 0:
            raise ValueError(f"default_deadline_ms must be > 0, got {default_deadline_ms}")
        self.app = app
        self.responder = responder
        self.metrics = metrics
        self.default_priority = default_priority
        self.default_deadline_ms = default_deadline_ms
        self.classifier = classifier
        self.early_drop = early_drop
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Admit, shed, or reject one request."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        now = self.clock()
        raw_priority, raw_deadline = _find_headers(scope)
        try:
            priority = self._classify(scope, raw_priority)
            deadline = absolute_deadline(raw_deadline, now, self.default_deadline_ms)
        except HeaderError as exc:
            self.metrics.bad_requests.labels(exc.header).inc()
            await send_bad_request(send, str(exc), exc.header)
            return
        ctx = RequestContext(arrival=now, deadline=deadline, priority=priority)
        self.metrics.count_request(priority)
        reason = self._shed_reason(ctx, now)
        if reason is not None and await self.responder.refuse(send, ctx, reason, ctx.priority):
            return
        await self.app(with_context(scope, ctx), receive, send)

    def _classify(self, scope: Scope, raw_priority: bytes | None) -> Priority:
        if self.classifier is None:
            return parse_priority(raw_priority, self.default_priority)
        priority, ignored = self.classifier.classify_scope(scope)
        if ignored:
            self.metrics.priority_ignored.inc()
        return priority

    def _shed_reason(self, ctx: RequestContext, now: float) -> ShedReason | None:
        if ctx.deadline is None:
            return None
        remaining_s = ctx.deadline - now
        if remaining_s <= 0.0:
            return ShedReason.DEADLINE
        if self.early_drop is not None and self.early_drop.should_drop(
            remaining_s, ctx.priority, now
        ):
            return ShedReason.EARLY_DROP
        return None


def _find_headers(scope: Scope) -> tuple[bytes | None, bytes | None]:
    priority: bytes | None = None
    deadline: bytes | None = None
    for name, value in scope.get("headers") or ():
        if name == PRIORITY_HEADER and priority is None:
            priority = value
        elif name == DEADLINE_HEADER and deadline is None:
            deadline = value
    return priority, deadline
