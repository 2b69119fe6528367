"""Pipeline: the stages ``build_stack`` composes, run by one object (issue 18, hot path).

Composed one by one, every stage is a middleware: one coroutine per stage
per request, each reading the request context back out of the scope, each
resumed again every time the request waits for I/O. ``build_stack`` (the
gateway, ``install``/``wrap``) builds the same middlewares and wraps them in
a ``Pipeline``, which runs the common path of all of them in sequence in one
``__call__`` around one call of the innermost stage per attempt:

    admission -> rate limit (when configured) -> capacity -> permit
    (queue / concurrency) -> retry -> breaker -> inner app

using each stage's own decision methods (``enter``, ``check``,
``try_enter``, ``try_acquire``, ``begin``/``attempts``, ``finish``) in one
frame: every coroutine level a request passes through costs it again each
time it waits. Whatever else a stage does (a malformed head, any shed,
dry-run, a request body to buffer, a wait in the queue) is handed to that
stage's middleware, whose inner app is the ordinary chain from there on:
those paths are the middlewares' own code, byte for byte. Non-HTTP scopes
(lifespan, websocket) go through the chain. The middlewares stay usable one
by one, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import RawHeaders, Receive, Scope, Send
from ballast_asgi.middleware import at_wire
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.body import BodyMiddleware
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.capacity import CapacityMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware, finish
from ballast_asgi.middleware.limit_route import limit_route
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.middleware.ratelimit import RateLimitMiddleware
from ballast_asgi.middleware.retry import RetryMiddleware


@dataclass(frozen=True, slots=True)
class Stages:
    """The middlewares of one stack, each wrapping the next (outermost first)."""

    admission: AdmissionMiddleware
    ratelimit: RateLimitMiddleware | None
    capacity: CapacityMiddleware
    body: BodyMiddleware
    queue: QueueMiddleware | None
    concurrency: ConcurrencyMiddleware
    retry: RetryMiddleware | None
    breaker: BreakerMiddleware


class Pipeline:
    """The stages as one ASGI app: their common path fused, the rest their own."""

    def __init__(self, stages: Stages) -> None:
        self.stages = stages
        #: The same stages as nested middlewares (every other path runs through them).
        self.app = stages.admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stages = self.stages
        entered = await stages.admission.enter(scope, receive, send)
        if entered is None:
            return
        ctx, scope = entered
        limited = stages.ratelimit
        if limited is not None:
            send, shed = await limited.check(scope, send)
            if shed is not None:
                await limited.responder.act(shed, ctx, limited.app, scope, receive, send)
                return
        capacity = stages.capacity.capacity
        if not capacity.try_enter(ctx.priority):
            await stages.capacity.refuse(ctx, ctx.priority, scope, receive, send)
            return
        try:
            if ctx.head.has_body:  # buffered by the body stage, which runs the chain on
                await stages.body(scope, receive, send)
                return
            concurrency = stages.concurrency
            now = concurrency.clock()
            permit = concurrency.limiter.try_acquire(now, limit_route(scope, ctx))
            if permit is None:  # the queue's wait, or the concurrency stage's ``limit`` shed
                if stages.queue is not None:
                    await stages.queue.wait_then_run(scope, receive, send, ctx, now)
                else:
                    await concurrency.refuse(ctx, scope, receive, send)
                return
            ctx.permit = permit
            retry = stages.retry
            try:
                if retry is not None and retry.begin(scope, ctx):
                    await retry.attempts(scope, receive, send, ctx, stages.breaker)
                else:
                    await stages.breaker(scope, receive, send)
            finally:
                finish(permit, ctx, concurrency.clock())
        finally:
            capacity.leave()

    def decide_at_wire(
        self,
        method: str,
        path: str,
        raw_path: bytes,
        headers: RawHeaders,
        host: str | None,
        memo: list[object] | None = None,
    ) -> Shed | None:
        """The shed this pipeline would answer a request head with now (counted as the
        stages count it), or None: the request goes the ordinary way (``at_wire.py``)."""
        return at_wire.decide(self.stages, method, path, raw_path, headers, host, memo)


__all__ = ["Pipeline", "Stages"]
