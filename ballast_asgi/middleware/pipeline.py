"""Pipeline: the stages ``build_stack`` composes, run by one object (issue 18, hot path).

Every stage's decisions live in one object, its *stage* (``AdmissionStage``,
``RateLimitStage``, ``CapacityStage``, ``BodyStage``, ``QueueStage``,
``ConcurrencyStage``, ``RetryStage``, ``BreakerStage``; ADR 0018). Each
middleware is a thin ASGI adapter around its stage (``mw.stage``): it finds
the context, calls the stage and its own inner app. Composed one by one that
is one coroutine per stage per request, each resumed again every time the
request waits for I/O. ``build_stack`` (the gateway, ``install``/``wrap``)
builds the same middlewares and wraps them in a ``Pipeline``, which calls the
same stage objects in sequence in one ``__call__`` around one call of the
innermost stage per attempt:

    admission -> rate limit (when configured) -> capacity -> permit
    (queue / concurrency) -> retry -> breaker -> inner app

Wherever a stage runs the rest of the request itself (dry-run admitting a
would-be shed, a request body to buffer, a wait in the queue, each retry
attempt), the pipeline hands it the next middleware as its inner app: from
there on the request runs through the chain. So both compositions run the
same decisions by construction; ``tests/middleware/test_compositions.py``
plays one script through both. Non-HTTP scopes (lifespan) go through the chain.
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
        self._admission = stages.admission.stage
        self._capacity = stages.capacity.stage
        self._concurrency = stages.concurrency.stage
        self._breaker = stages.breaker.stage

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stages = self.stages
        entered = await self._admission.enter(stages.admission.app, scope, receive, send)
        if entered is None:
            return
        ctx, scope = entered
        limited = stages.ratelimit
        if limited is not None:
            send, shed = await limited.stage.check(scope, send)
            if shed is not None:
                await limited.stage.responder.act(shed, ctx, limited.app, scope, receive, send)
                return
        capacity = self._capacity
        if not capacity.capacity.try_enter(ctx.priority):
            await capacity.refuse(ctx, ctx.priority, stages.capacity.app, scope, receive, send)
            return
        try:
            if ctx.head.has_body:  # buffered by the body stage, which runs the chain on
                await stages.body.stage.run(stages.body.app, scope, receive, send, ctx)
                return
            concurrency = self._concurrency
            now = concurrency.clock()
            permit = concurrency.limiter.try_acquire(now, limit_route(scope, ctx))
            if permit is None:  # the queue's wait, or the concurrency stage's ``limit`` shed
                queue = stages.queue
                if queue is not None:
                    await queue.stage.wait_then_run(queue.app, scope, receive, send, ctx, now)
                else:
                    await concurrency.refuse(ctx, stages.concurrency.app, scope, receive, send)
                return
            ctx.permit = permit
            retry = stages.retry
            try:
                if retry is not None and retry.stage.begin(scope, ctx):
                    await retry.stage.attempts(stages.breaker, scope, receive, send, ctx)
                else:
                    await self._breaker.attempt(stages.breaker.app, scope, receive, send, ctx)
            finally:
                finish(permit, ctx, concurrency.clock())
        finally:
            capacity.capacity.leave()

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
