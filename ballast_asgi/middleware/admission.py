"""AdmissionMiddleware: parse the tier and deadline, drop the dead on arrival.

The outermost shedding stage. For each HTTP request it

0. reads the head once (``core/head.py``): a target that is not origin-form
   gets 400, too many or too large headers 431, a declared Content-Length
   above the body limit 413, a duplicated X-Deadline-Ms with disagreeing
   values 400, ambiguous framing 400/501, a duplicate Host 400, CONNECT 405
   and a protocol switch with a body 400; all before anything else (no
   budget, no permit, no read, never a limiter or breaker sample);
1. matches the request to its route, once (``RouteTable.match``: configured
   routes, the app's route template, an automatic first-segment group; the
   ``Route`` goes on the context as ``ctx.route`` and every later stage reads
   its policy from there);
2. parses ``X-Priority`` and ``X-Deadline-Ms`` (400 naming the header when malformed);
3. lets the ``Classifier`` (when given) choose the tier: a trusted ``X-Priority``,
   else consumer key, path rules, the route's priority and the default; the
   route's ``deadline_ms`` replaces the default deadline; an untrusted header is ignored
   (counted in ``ballast_priority_header_ignored_total``), not validated;
4. sheds with ``deadline`` a request whose budget is already spent, and with
   ``early_drop`` one that cannot make its deadline (when an estimator is given);
5. otherwise creates the ``RequestContext`` and calls the inner app with it in
   scope, with a private copy of the header list (a server appending chunked
   trailers to it later cannot change what is forwarded) in which
   ``X-Priority`` is normalised to the tier chosen, or removed when it was
   ignored (an untrusted value never reaches the upstream).

Dry-run (``responder.dry_run``): a request step 4 would shed is counted in
``ballast_dry_run_shed_total`` and admitted; a dead-on-arrival one goes upstream
with ``X-Deadline-Ms: 0``. A malformed header is still a 400 (not a shed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Protocol

from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.deadline import absolute_deadline
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.head import HeadLimits, RequestHead, check_target, read_head
from ballast_asgi.core.outcome import DEFAULT_FAILURE_STATUSES, ShedReason
from ballast_asgi.core.priority import PRIORITY_HEADER, Priority, parse_priority
from ballast_asgi.core.routes import Route, RouteTable
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import ASGIApp, Clock, RawHeaders, Receive, Scope, Send
from ballast_asgi.middleware.context import SCOPE_KEY, RequestContext
from ballast_asgi.middleware.responses import ShedResponder, send_refusal
from ballast_asgi.telemetry.metrics import Metrics

#: The app's route template of a request (``embed.route_template``), or None.
RouteKey = Callable[[Scope], "str | None"]
#: An admitted request: its context, the scope the inner stages get, and a shed to act on.
Admitted = tuple[RequestContext, Scope, "Shed | None"]
#: A request read at admission: head, route, tier, X-Priority ignored, absolute deadline.
Read = tuple[RequestHead, Route, Priority, bool, "float | None"]
#: Scope key of ``(admission, Read, now)``: the head as the server's shed at the wire read
#: it (``middleware/at_wire.py``); admission counts it and does not read it again.
WIRE_READ = "ballast.wire_read"


class EarlyDrop(Protocol):
    """Decides whether a request can still make its deadline."""

    def should_drop(self, remaining_s: float, priority: Priority, now: float) -> bool: ...


class AdmissionStage:
    """The admission stage's decisions: the head read once, the route, the tier, the deadline."""

    def __init__(
        self,
        *,
        responder: ShedResponder,
        metrics: Metrics,
        default_priority: Priority = Priority.STANDARD,
        default_deadline_ms: float | None = None,
        classifier: Classifier | None = None,
        early_drop: EarlyDrop | None = None,
        limits: HeadLimits = HeadLimits(),  # noqa: B008 - frozen value object
        failure_statuses: Collection[int] = DEFAULT_FAILURE_STATUSES,
        route_key: RouteKey | None = None,
        routes: RouteTable | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if default_deadline_ms is not None and default_deadline_ms <= 0:
            raise ValueError(f"default_deadline_ms must be > 0, got {default_deadline_ms}")
        self.responder = responder
        self.metrics = metrics
        self.default_priority = default_priority
        self.default_deadline_ms = default_deadline_ms
        self.classifier = classifier
        self.early_drop = early_drop
        self.limits = limits
        self.failure_statuses = frozenset(failure_statuses)
        self.route_key = route_key
        self._key_header = None if classifier is None else classifier.key_header
        #: Matches each request to its route (default: automatic groups only).
        self.routes = RouteTable() if routes is None else routes
        self.clock = clock
        #: ``metrics.count_request`` by tier, bound once (one call less per request).
        self._count_request = metrics.request_adders

    async def enter(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> tuple[RequestContext, Scope] | None:
        """The admitted request's context and inner scope; None once it was answered here.

        A malformed head is refused; a shed is acted on (dry-run: ``app``, the
        inner app, runs here).
        """
        admitted = self.admit(scope)
        if isinstance(admitted, HeaderError):
            await self.refuse(send, admitted)
            return None
        if isinstance(admitted, Shed):  # enforcing: answered before any context is built
            await self.responder.shed(send, admitted)
            return None
        ctx, child, shed = admitted
        if shed is not None:
            await self.responder.act(shed, ctx, app, child, receive, send)
            return None
        return ctx, child

    def admit(self, scope: Scope) -> Admitted | Shed | HeaderError:
        """The request's context, its scope for the inner stages and the shed decision.

        Or the ``HeaderError`` to answer with ``refuse``, or (enforcing) the
        ``Shed`` to answer, decided before the context and the inner scope are
        built (issue 18: a shed builds nothing it does not send). Counts the request.
        """
        pre = scope.get(WIRE_READ)
        if pre is not None and pre[0] is self:  # read by the server at the wire, not shed
            _, (head, route, priority, ignored, deadline), now = pre
            self.routes.count(route)
            if ignored:
                self.metrics.priority_ignored.inc()
        else:
            now = self.clock()
            client = scope.get("client")
            try:
                template = None if self.route_key is None else self.route_key(scope)
                head, route, priority, ignored, deadline = self.read(
                    scope["method"], scope["path"], scope.get("raw_path") or scope["path"],
                    scope["headers"], client[0] if client else None, now, template,
                )  # fmt: skip
            except HeaderError as exc:
                return exc
        self._count_request[priority](1)  # ``metrics.count_request``
        shed = None if deadline is None else self.decide(deadline, priority, now)
        if shed is not None and not self.responder.dry_run:
            return shed
        # Positional: the field order of ``RequestContext`` (keywords cost twice as much).
        ctx = RequestContext(
            now, deadline, priority, head, route, None, 0, 0.0, None, None, None, None, [], (),
            self.clock, self.failure_statuses,
        )  # fmt: skip
        routes = self.routes
        if route is routes.other and routes.learn_groups:
            ctx.learn_route = routes.learn
        # ``with_context`` and ``_forwarded_headers``, inlined (once per request)
        child = dict(scope)
        state = scope.get("state")
        state = dict(state) if state else {}
        state[SCOPE_KEY] = ctx
        child["state"] = state
        child[SCOPE_KEY] = ctx
        headers = scope["headers"]
        child["headers"] = (
            list(headers)
            if head.priority is None
            else _forwarded_headers(headers, head, priority, ignored)
        )
        return ctx, child, shed

    async def refuse(self, send: Send, exc: HeaderError) -> None:
        """The 4xx for a malformed or oversized head, counted by header."""
        self.metrics.bad_requests.labels(exc.header).inc()
        await send_refusal(send, exc)

    def read(
        self,
        method: str,
        path: str,
        raw_path: bytes | str,
        headers: RawHeaders,
        host: str | None,
        now: float,
        template: str | None = None,
        count: bool = True,
    ) -> Read:
        """The head, route, tier (and whether X-Priority was ignored) and absolute deadline.

        Raises ``HeaderError``. The ASGI path (``admit``) and the shed at the wire
        (``middleware/at_wire.py``) both read a request here. ``count``: the route
        match and an ignored X-Priority are counted as they are read (``admit``);
        False counts nothing, ``count`` does it later (the wire, for a request it answers).
        """
        head = read_head(headers, self.limits, method, self._key_header)
        check_target(raw_path, path)
        routes = self.routes
        route = (
            routes.match(method, path, template) if count else routes.find(method, path, template)
        )
        if self.classifier is None:
            default = self.default_priority if route.priority is None else route.priority
            priority, ignored = parse_priority(head.priority, default), False
        else:
            priority, ignored = self.classifier.classify_head(
                method, path, head, host, route.priority
            )
            if ignored and count:
                self.metrics.priority_ignored.inc()
        default_ms: float | None = route.deadline_ms
        if default_ms is None:
            default_ms = self.default_deadline_ms
        if head.deadline is None and default_ms is None:  # ``absolute_deadline``'s None
            return head, route, priority, ignored, None
        return head, route, priority, ignored, absolute_deadline(head.deadline, now, default_ms)

    def count(self, route: Route, priority: Priority, ignored: bool) -> None:
        """What ``admit`` counts for a request ``read(count=False)`` read (the wire's shed)."""
        self.routes.count(route)
        if ignored:
            self.metrics.priority_ignored.inc()
        self._count_request[priority](1)  # ``metrics.count_request``

    def decide(self, deadline: float | None, priority: Priority, now: float) -> Shed | None:
        """``deadline`` when the budget is spent, ``early_drop`` when it cannot be met."""
        if deadline is None:
            return None
        remaining_s = deadline - now
        if remaining_s <= 0.0:
            return _DOA[priority]
        if self.early_drop is not None and self.early_drop.should_drop(remaining_s, priority, now):
            return _EARLY[priority]
        return None


class AdmissionMiddleware:
    """Deadline admission and request classification (``AdmissionStage`` as a middleware)."""

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
        limits: HeadLimits = HeadLimits(),  # noqa: B008 - frozen value object
        failure_statuses: Collection[int] = DEFAULT_FAILURE_STATUSES,
        route_key: RouteKey | None = None,
        routes: RouteTable | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.app = app
        self.stage = AdmissionStage(
            responder=responder, metrics=metrics, default_priority=default_priority,
            default_deadline_ms=default_deadline_ms, classifier=classifier,
            early_drop=early_drop, limits=limits, failure_statuses=failure_statuses,
            route_key=route_key, routes=routes, clock=clock,
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Admit, shed, or reject one request."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        entered = await self.stage.enter(self.app, scope, receive, send)
        if entered is not None:
            await self.app(entered[1], receive, send)


#: The admission sheds, one value per tier (``Shed`` is frozen).
_DOA = {p: Shed(ShedReason.DEADLINE, p) for p in Priority}
_EARLY = {p: Shed(ShedReason.EARLY_DROP, p) for p in Priority}


_TIER_VALUES = {p: (PRIORITY_HEADER, p.label.encode()) for p in Priority}


def _forwarded_headers(
    headers: RawHeaders, head: RequestHead, priority: Priority, ignored: bool
) -> RawHeaders:
    """A private copy of ``headers``; X-Priority normalised to ``priority`` or removed."""
    if head.priority is None:
        return list(headers)
    kept = [h for h in headers if h[0] != PRIORITY_HEADER]
    if not ignored:
        kept.append(_TIER_VALUES[priority])
    return kept
