"""ConcurrencyMiddleware: hold a permit while the inner app runs; release it once.

Uses the permit the queue stage granted (``ctx.permit``) or takes one itself;
without one the request is shed with ``limit``. After the inner app returns or
raises, the permit is released exactly once, in ``finally``, with the
limiter signal of the last attempt's recorded ``AttemptOutcome``
(``limiter_signal``: success samples the attempt's time to the response head,
upstream failures are drops) and IGNORED when no upstream attempt was recorded
(shed downstream, the client left first, the gateway's own error): only
upstream outcomes feed the limiter. Something inside must record them: the
proxy, ``BreakerMiddleware`` (from the status) or, in an app,
``HandlerMiddleware`` as the innermost stage (``build_stack`` always has one).

Dry-run (``responder.dry_run``): a request over the limit is counted in
``ballast_dry_run_shed_total`` and runs without a permit, as does one an outer
stage already admitted that way (``ctx.would_shed``); nothing is released for
it, so the limiter's in-flight and samples are exactly enforcement's. The
breaker stage, when dry-run admits a request it would shed, hands the permit
back early and clears ``ctx.permit``; the release here is then skipped (a
permit taken off the context without being released goes back IGNORED:
``finish``, the same call the fused pipeline makes).
"""

from __future__ import annotations

import time

from ballast_asgi.core.limiter import Limiter, Permit
from ballast_asgi.core.outcome import Outcome, ShedReason, limiter_signal
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import ASGIApp, Clock, Receive, Scope, Send
from ballast_asgi.middleware.context import RequestContext, get_context
from ballast_asgi.middleware.limit_route import limit_route
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.metrics import Metrics


def release(permit: Permit, ctx: RequestContext, now: float) -> None:
    """Release ``permit`` with the signal of the request's last recorded attempt."""
    outcome = ctx.outcome
    if outcome is None:
        permit.release(Outcome.IGNORED, now)
    else:
        permit.release(limiter_signal(outcome), now, ctx.rtt_s)


def finish(permit: Permit, ctx: RequestContext, now: float) -> None:
    """After the inner app: release ``permit`` once, as the concurrency and queue stages do.

    With the last attempt's signal while the request still holds it; IGNORED if
    someone took it off the context without releasing it (the queue's safety
    net); nothing when an inner stage already handed it back.
    """
    if ctx.permit is permit:  # ``release``, inlined
        outcome = ctx.outcome
        if outcome is None:
            permit.release(Outcome.IGNORED, now)
        else:
            permit.release(limiter_signal(outcome), now, ctx.rtt_s)
    elif not permit.released:
        permit.release(Outcome.IGNORED, now)


class ConcurrencyStage:
    """The concurrency stage's decisions: take a permit, the ``limit`` shed, the release."""

    __slots__ = ("clock", "limiter", "responder")

    def __init__(
        self, limiter: Limiter, responder: ShedResponder, metrics: Metrics, clock: Clock
    ) -> None:
        self.limiter = limiter
        self.responder = responder
        self.clock = clock
        metrics.bind_limiter(
            lambda: float(limiter.limit),
            lambda: float(limiter.inflight),
            lambda: limiter.rtt_recent_s or 0.0,
            lambda: limiter.rtt_min_s or 0.0,
        )

    async def refuse(
        self, ctx: RequestContext, app: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Act on the ``limit`` shed of a request that found no free permit (dry-run: ``app``)."""
        shed = Shed(ShedReason.LIMIT, ctx.priority)
        await self.responder.act(shed, ctx, app, scope, receive, send)


class ConcurrencyMiddleware:
    """Enforces the concurrency limit around the inner app (``ConcurrencyStage``)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: Limiter,
        responder: ShedResponder,
        metrics: Metrics,
        clock: Clock = time.monotonic,
    ) -> None:
        self.app = app
        self.stage = ConcurrencyStage(limiter, responder, metrics, clock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the inner app under a permit, or shed with ``limit``."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = get_context(scope)
        stage = self.stage
        permit = ctx.permit
        if permit is None and not ctx.would_shed:
            permit = stage.limiter.try_acquire(stage.clock(), limit_route(scope, ctx))
            if permit is None:
                await stage.refuse(ctx, self.app, scope, receive, send)
                return
            ctx.permit = permit
        if permit is None:  # dry-run: admitted outside every limit; no permit to release
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            finish(permit, ctx, stage.clock())
