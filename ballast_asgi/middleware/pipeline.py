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

from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import RawHeaders, Receive, Scope, Send
from ballast_asgi.middleware import at_wire
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.body import BodyMiddleware
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.capacity import CapacityMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware, finish
from ballast_asgi.middleware.limit_route import limit_key
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
        #: The shed responder of the stages (the one ``ShedResponder`` they share).
        self.responder = stages.admission.stage.responder
        # What ``__call__`` reads per request, read once (the stages are fixed per pipeline).
        self._admission_app = stages.admission.app
        self._held = self._capacity.capacity
        self._limiter = self._concurrency.limiter
        self._clock = self._concurrency.clock
        self._retry = None if stages.retry is None else stages.retry.stage
        #: The shed decision at the wire for these stages (``decide_at_wire``).
        self.wire = at_wire.WireDecision(stages)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stages = self.stages
        admission = self._admission
        admitted = admission.admit(scope)  # ``AdmissionStage.enter``, inlined
        if admitted.__class__ is not tuple:
            if isinstance(admitted, HeaderError):
                await admission.refuse(send, admitted)
            else:  # enforcing: answered before any context is built
                await admission.responder.shed(send, admitted)  # type: ignore[arg-type]
            return
        ctx, scope, shed = admitted
        if shed is not None:
            await admission.responder.act(shed, ctx, self._admission_app, scope, receive, send)
            return
        limited = stages.ratelimit
        if limited is not None:
            send, shed = await limited.stage.check(scope, send)
            if shed is not None:
                await limited.stage.responder.act(shed, ctx, limited.app, scope, receive, send)
                return
        held = self._held
        if not held.try_enter(ctx.priority):
            await self._capacity.refuse(
                ctx, ctx.priority, stages.capacity.app, scope, receive, send
            )
            return
        try:
            if ctx.head.has_body:  # buffered by the body stage, which runs the chain on
                await stages.body.stage.run(stages.body.app, scope, receive, send, ctx)
                return
            key = limit_key(ctx.route, scope.get("path"))
            now = self._clock()
            permit = self._limiter.try_acquire(now, key)
            if permit is None:  # the queue's wait, or the concurrency stage's ``limit`` shed
                queue = stages.queue
                if queue is not None:
                    await queue.stage.wait_then_run(queue.app, scope, receive, send, ctx, now)
                else:
                    await self._concurrency.refuse(
                        ctx, stages.concurrency.app, scope, receive, send
                    )
                return
            ctx.permit = permit
            retry = self._retry
            try:
                if retry is not None and retry.begin(scope, ctx):
                    await retry.attempts(stages.breaker, scope, receive, send, ctx)
                else:
                    await self._breaker.attempt(stages.breaker.app, scope, receive, send, ctx)
            finally:
                finish(permit, ctx, self._clock())
        finally:
            held.leave()

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
        return self.wire.decide(method, path, raw_path, headers, host, memo)


__all__ = ["Pipeline", "Stages"]
