"""BreakerMiddleware: one breaker ticket per attempt, settled at the response head.

The innermost stage (``RetryMiddleware`` runs it once per attempt). Per attempt:

1. The breaker of the request's route (``ctx.route.name``, matched once at
   admission; see ``core/routes.py`` and ``core/breaker_set.py``) is asked for
   a ticket. While it is open (or half-open with its probe out) the request is
   shed at once with reason ``breaker_open`` (503 by default: the upstream is
   unavailable) and ``Retry-After`` = the remaining open time.
2. The ticket is settled exactly once, from the attempt's ``AttemptOutcome``
   through ``breaker_verdict``: success, failure, or neutral (cancelled: the
   request's own deadline, the client leaving, the gateway's own error). It
   is settled when the response head is sent (the outcome is known then; a
   long stream does not hold a half-open probe), or when the attempt ends
   without a head. The head's outcome is the one recorded by the producer
   (the proxy or the app's handler stage); when nobody recorded one, the
   status decides (``failure_statuses``). An attempt that raises with nothing
   recorded is the gateway's own error: neutral. A failure is reported with
   the request's client address (``core/forwarded.client_ip``: the peer, or
   the trusted ``X-Forwarded-For`` client) and, for a connect error, as
   *shared* (it cannot depend on the request): the breaker opens on
   request-dependent failures only when several clients fail
   (``breaker.min_failing_clients``). A request on the route ``other`` whose
   head came from the upstream tells the route table its status
   (``ctx.learn_route``), so a first path segment the upstream knows gets an
   automatic route of its own (the proxy's own 502/504 teach nothing).

A request shed here hands its concurrency permit back at once (released
IGNORED, ``ctx.permit`` cleared): it never reaches the upstream. Dry-run
(``responder.dry_run``): such a request is counted in
``ballast_dry_run_shed_total`` and goes upstream with no ticket and no permit,
exactly what enforcement would have held. A request an outer stage already
admitted that way (``ctx.would_shed``) passes straight through.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Collection

from ballast_asgi.core.breaker import Breaker, BreakerState, Ticket
from ballast_asgi.core.breaker_set import BreakerSet
from ballast_asgi.core.forwarded import client_ip
from ballast_asgi.core.native import mypyc_attr
from ballast_asgi.core.outcome import (
    AttemptOutcome,
    Outcome,
    ShedReason,
    Verdict,
    breaker_verdict,
    status_outcome,
)
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import ASGIApp, Clock, Message, Receive, Scope, Send
from ballast_asgi.middleware.context import SCOPE_KEY, RequestContext
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.events import emit
from ballast_asgi.telemetry.metrics import Metrics


class BreakerStage:
    """The breaker stage's decisions: a ticket per attempt, the ``breaker_open`` shed, verdicts."""

    def __init__(
        self,
        *,
        breaker: Breaker | BreakerSet,
        responder: ShedResponder,
        metrics: Metrics,
        failure_statuses: Collection[int] | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.breakers = breaker if isinstance(breaker, BreakerSet) else _single(breaker)
        self._responder = responder
        self._clock = clock
        self._failure_statuses = (
            self.breakers.default.failure_statuses
            if failure_statuses is None
            else frozenset(failure_statuses)
        )
        _bind_metrics(metrics, self.breakers, clock)

    def admits(self, ctx: RequestContext, now: float) -> bool:
        """Whether another attempt of this request would get a ticket (the retry gate)."""
        return self.breakers.get(_key(ctx)).can_acquire(now)

    async def attempt(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, ctx: RequestContext | None
    ) -> None:
        """One attempt through ``app`` under a ticket, or the ``breaker_open`` shed."""
        route = None if ctx is None else ctx.route  # ``_key``, inlined
        breaker = self.breakers.get(None if route is None else route.name)
        now = self._clock()
        client = client_ip(scope)
        ticket = None if ctx is None else ctx.ticket
        if ticket is not None:  # taken by the lane before it handed the request on
            ctx.ticket = None  # type: ignore[union-attr]
        else:
            ticket = breaker.acquire(now, client)
        if ticket is None:
            priority = self._responder.priority_of(ctx)
            shed = Shed(ShedReason.BREAKER_OPEN, priority, breaker.retry_after_s(now))
            self._hand_back_permit(ctx, now)
            await self._responder.act(shed, ctx, app, scope, receive, send)
            return
        failure_statuses = self._failure_statuses

        def settle_at_head(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start" and not ticket.settled:
                status = int(message["status"])
                if ctx is None:
                    self._settle(ticket, status_outcome(status, failure_statuses), client)
                else:
                    self.at_head(ticket, ctx, status, client, scope["path"])
            return send(message)

        try:
            await app(scope, receive, settle_at_head)
        finally:
            if not ticket.settled:
                recorded = None if ctx is None else ctx.outcome
                self._settle(ticket, recorded or AttemptOutcome.GATEWAY_ERROR, client)

    def at_head(
        self, ticket: Ticket, ctx: RequestContext, status: int, client: str | None, path: str
    ) -> None:
        """The attempt's response head is sent: settle its ticket (the lane calls this too)."""
        if ctx.outcome is None:  # the producer (proxy, handler) recorded it before
            ctx.record_status(status)
        self._settle(ticket, ctx.outcome or AttemptOutcome.GATEWAY_ERROR, client)
        if ctx.learn_route is not None and ctx.outcome in _ANSWERED:
            ctx.learn_route(path, status)  # on ``other``: a known segment?

    def settle(self, ticket: Ticket, outcome: AttemptOutcome, client: str | None) -> None:
        """Settle ``ticket`` by ``outcome`` (its verdict: success, failure or neutral)."""
        self._settle(ticket, outcome, client)

    def _settle(self, ticket: Ticket, outcome: AttemptOutcome, client: str | None) -> None:
        verdict = breaker_verdict(outcome)
        if verdict is Verdict.NEUTRAL:
            ticket.cancel()
        elif verdict is Verdict.SUCCESS:
            ticket.record(True, self._clock())
        else:
            shared = outcome is AttemptOutcome.CONNECT_ERROR
            ticket.record(False, self._clock(), client=client, shared=shared)

    @staticmethod
    def _hand_back_permit(ctx: RequestContext | None, now: float) -> None:
        """A request shed here never reaches the upstream: its permit goes back now, IGNORED.

        Enforcing or dry-run alike, so the limiter holds the same either way
        (the concurrency stage sees ``ctx.permit`` cleared and releases nothing).
        """
        if ctx is not None and ctx.permit is not None:
            permit, ctx.permit = ctx.permit, None
            permit.release(Outcome.IGNORED, now)


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (ADR 0021), open to subclasses
class BreakerMiddleware:
    """Shed while the breaker is open; feed it each attempt's verdict (``BreakerStage``)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        breaker: Breaker | BreakerSet,
        responder: ShedResponder,
        metrics: Metrics,
        failure_statuses: Collection[int] | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.app = app
        self.stage = BreakerStage(
            breaker=breaker, responder=responder, metrics=metrics,
            failure_statuses=failure_statuses, clock=clock,
        )  # fmt: skip
        #: The retry stage's gate (``RetryMiddleware(gate=...)``).
        self.admits = self.stage.admits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One attempt under a ticket; non-HTTP and dry-run admitted requests pass through."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = scope.get(SCOPE_KEY)  # ``find_context``, inlined
        if not isinstance(ctx, RequestContext):
            ctx = None
        elif ctx.would_shed:
            await self.app(scope, receive, send)  # dry-run: admitted outside every limit
            return
        await self.stage.attempt(self.app, scope, receive, send, ctx)


#: Outcomes whose head came from the upstream (or the app), not from the proxy's own 502/504.
_ANSWERED = frozenset({AttemptOutcome.SUCCESS, AttemptOutcome.STATUS_5XX})


def _key(ctx: RequestContext | None) -> str | None:
    """The breaker key of a request: its route's name (None without a context or route)."""
    if ctx is None or ctx.route is None:
        return None
    return ctx.route.name


def _single(breaker: Breaker) -> BreakerSet:
    """A set whose every key shares ``breaker``."""
    return BreakerSet(lambda: breaker, max_keys=0)


def _bind_metrics(metrics: Metrics, breakers: BreakerSet, clock: Clock) -> None:
    def worst_state() -> str:
        return breakers.worst(clock()).state(clock()).value

    def worst_seconds() -> float:
        return breakers.worst(clock()).seconds_in_state(clock())

    metrics.bind_breaker(worst_state, worst_seconds)
    for state in BreakerState:
        metrics.breaker_transitions.labels(state.value)

    def count(route: str | None, old: BreakerState, new: BreakerState, at: float) -> None:
        metrics.breaker_transitions.labels(new.value).inc()
        level = "warning" if new is BreakerState.OPEN else "info"
        emit(f"breaker.{new.value}", level, key=route or "", route=route, previous=old.value)

    breakers.set_on_transition(count)
