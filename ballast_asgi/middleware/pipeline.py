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

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.limiter import Permit
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import RawHeaders, Receive, Scope, Send
from ballast_asgi.middleware import at_wire
from ballast_asgi.middleware.admission import AdmissionMiddleware, AdmissionStage
from ballast_asgi.middleware.body import BodyMiddleware
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.capacity import CapacityMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware, finish
from ballast_asgi.middleware.context import RequestContext
from ballast_asgi.middleware.limit_route import limit_key
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.middleware.ratelimit import RateLimitMiddleware
from ballast_asgi.middleware.responses import ShedResponder
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


#: A request ``Pipeline.enter`` gave its capacity slot and permit: context, scope, permit.
Entered = tuple[RequestContext, Scope, Permit]
#: What runs instead, on the ASGI path: ``await cont(receive, send)``.
Continue = Callable[[Receive, Send], Awaitable[None]]


async def _refuse(
    admission: AdmissionStage, exc: HeaderError, receive: Receive, send: Send
) -> None:
    await admission.refuse(send, exc)


async def _shed(responder: ShedResponder, shed: Shed, receive: Receive, send: Send) -> None:
    await responder.shed(send, shed)


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
        entered = self.enter(scope)
        if entered.__class__ is tuple:
            await self.permitted(entered, None, receive, send)
        else:
            await entered(receive, send)  # type: ignore[operator]

    def enter(self, scope: Scope) -> Entered | Continue:
        """The stages up to the permit, without waiting: ``(ctx, scope, permit)`` of a request
        that holds its capacity slot and its permit (``permitted`` runs the rest), or what
        runs instead, as ``await cont(receive, send)``: a refusal, a shed, the rate-limit
        check, the body stage, the queue's wait. Everything counted here is counted once,
        whoever runs the rest (the ASGI path, or the lane: ``gateway/lane.py``)."""
        admission = self._admission
        admitted = admission.admit(scope)  # ``AdmissionStage.enter``, inlined
        if admitted.__class__ is not tuple:
            if isinstance(admitted, HeaderError):
                return partial(_refuse, admission, admitted)
            return partial(_shed, admission.responder, admitted)  # type: ignore[arg-type]
        ctx, scope, shed = admitted
        if shed is not None:
            return partial(admission.responder.act, shed, ctx, self._admission_app, scope)
        if self.stages.ratelimit is not None:
            return partial(self._limited, ctx, scope)
        return self._held_and_permit(ctx, scope)

    def _held_and_permit(self, ctx: RequestContext, scope: Scope) -> Entered | Continue:
        """Capacity, then (a request without a body) a permit; what runs instead."""
        stages = self.stages
        held = self._held
        if not held.try_enter(ctx.priority):
            capacity = self._capacity
            return partial(capacity.refuse, ctx, ctx.priority, stages.capacity.app, scope)
        try:
            if ctx.head.has_body:  # buffered by the body stage, which runs the chain on
                return partial(self._body, ctx, scope)
            key = limit_key(ctx.route, scope.get("path"))
            now = self._clock()
            permit = self._limiter.try_acquire(now, key)
        except BaseException:
            held.leave()
            raise
        if permit is None:  # the queue's wait, or the concurrency stage's ``limit`` shed
            if stages.queue is not None:
                return partial(self._wait, ctx, scope, now)
            return partial(self._limit, ctx, scope)
        ctx.permit = permit
        return ctx, scope, permit

    async def permitted(
        self, entered: Entered, retrying: bool | None, receive: Receive, send: Send
    ) -> None:
        """The rest of a request ``enter`` gave its permit: every attempt (retry and breaker
        stages, the inner app), then the permit released and the capacity slot left.

        ``retrying``: None to ask the retry stage (``RetryStage.begin``, which counts an
        original); the lane passes what it already asked."""
        ctx, scope, permit = entered
        stages = self.stages
        try:
            try:
                retry = self._retry
                if retrying is None:
                    retrying = retry is not None and retry.begin(scope, ctx)
                if retrying:
                    await retry.attempts(stages.breaker, scope, receive, send, ctx)  # type: ignore[union-attr]
                else:
                    await self._breaker.attempt(stages.breaker.app, scope, receive, send, ctx)
            finally:
                finish(permit, ctx, self._clock())
        finally:
            self._held.leave()

    async def _limited(
        self, ctx: RequestContext, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """The rate-limit check (it may await Redis), then the stages after it."""
        limited = self.stages.ratelimit
        assert limited is not None
        send, shed = await limited.stage.check(scope, send)
        if shed is not None:
            await limited.stage.responder.act(shed, ctx, limited.app, scope, receive, send)
            return
        entered = self._held_and_permit(ctx, scope)
        if entered.__class__ is tuple:
            await self.permitted(entered, None, receive, send)
        else:
            await entered(receive, send)  # type: ignore[operator]

    async def _body(self, ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> None:
        """The body stage (it reads the body, then runs the chain on), then the slot left."""
        body = self.stages.body
        try:
            await body.stage.run(body.app, scope, receive, send, ctx)
        finally:
            self._held.leave()

    async def _wait(
        self, ctx: RequestContext, scope: Scope, now: float, receive: Receive, send: Send
    ) -> None:
        """The queue's wait (it runs the chain on with the permit it gets), then the slot left."""
        queue = self.stages.queue
        assert queue is not None
        try:
            await queue.stage.wait_then_run(queue.app, scope, receive, send, ctx, now)
        finally:
            self._held.leave()

    async def _limit(self, ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> None:
        """The concurrency stage's ``limit`` shed (no queue), then the slot left."""
        try:
            await self._concurrency.refuse(ctx, self.stages.concurrency.app, scope, receive, send)
        finally:
            self._held.leave()

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
