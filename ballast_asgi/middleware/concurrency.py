"""ConcurrencyMiddleware: hold a permit while the inner app runs; release it once.

Uses the permit the queue stage granted (``ctx.permit``) or takes one itself;
without one the request is shed with ``limit``. After the inner app returns or
raises, the permit is released exactly once, in ``finally``, with the outcome:

1. ``ctx.outcome`` when an inner stage set it;
2. IGNORED when the request was cancelled, the client went away
   (``ctx.client_gone``), or an inner stage shed it (``ctx.shed_reason``,
   so nothing reached the upstream);
3. DROPPED when the inner app raised, the proxy reported ``ctx.upstream_error``,
   or the response status is >= 500;
4. IGNORED when no response was started at all;
5. SUCCESS otherwise (the round trip is an RTT sample).

Dry-run (``responder.dry_run``): a request over the limit is counted in
``ballast_dry_run_shed_total`` and runs without a permit, as does one an outer
stage already admitted that way (``ctx.would_shed``); nothing is released for
it, so the limiter's in-flight and samples are exactly enforcement's. The
breaker stage, when dry-run admits a request it would shed, hands the permit
back early and clears ``ctx.permit``; the release here is then skipped.
"""

from __future__ import annotations

import asyncio
import time

from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import Outcome, ShedReason
from ballast_asgi.core.types import ASGIApp, Clock, Message, Receive, Scope, Send
from ballast_asgi.metrics import Metrics
from ballast_asgi.middleware.context import RequestContext, get_context
from ballast_asgi.middleware.responses import ShedResponder


def outcome_for(ctx: RequestContext, status: int | None, error: BaseException | None) -> Outcome:
    """The limiter outcome of a finished request (the rule in the module docstring)."""
    if ctx.outcome is not None:
        return ctx.outcome
    if isinstance(error, asyncio.CancelledError) or ctx.client_gone or ctx.shed_reason is not None:
        return Outcome.IGNORED
    if error is not None or ctx.upstream_error is not None:
        return Outcome.DROPPED
    if status is None:
        return Outcome.IGNORED
    return Outcome.DROPPED if status >= 500 else Outcome.SUCCESS


class ConcurrencyMiddleware:
    """Enforces the concurrency limit around the inner app."""

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
        self.limiter = limiter
        self.responder = responder
        self.metrics = metrics
        self.clock = clock
        metrics.bind_limiter(
            lambda: float(limiter.limit),
            lambda: float(limiter.inflight),
            lambda: limiter.rtt_recent_s or 0.0,
            lambda: limiter.rtt_min_s or 0.0,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the inner app under a permit, or shed with ``limit``."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = get_context(scope)
        permit = ctx.permit
        if permit is None and not ctx.would_shed:
            permit = self.limiter.try_acquire(self.clock())
            if permit is None and await self.responder.refuse(
                send, ctx, ShedReason.LIMIT, ctx.priority
            ):
                return
            ctx.permit = permit
        if permit is None:  # dry-run: admitted over the limit; no permit to release
            await self.app(scope, receive, send)
            return
        status: int | None = None
        error: BaseException | None = None

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if ctx.permit is permit:  # else an inner stage handed it back (dry-run breaker)
                permit.release(outcome_for(ctx, status, error), self.clock())
