"""QueueMiddleware: wait for a concurrency permit in the priority queue.

For each HTTP request (inside ``AdmissionMiddleware``):

1. take a free permit at once if there is one (``ctx.permit``);
2. otherwise queue a ``Waiter`` (maybe displacing a lower tier's, or being
   refused with ``queue_full``) and await a future, with one loop timer
   armed at the waiter's expiry: the waiter is shed the moment its deadline
   (``deadline``) or queue timeout (``queue_timeout``) passes, not at dequeue;
3. while waiting, watch ``receive()`` (``_asgi.watch_disconnect``): body
   messages are kept and replayed to the inner app later; ``http.disconnect``
   removes the waiter and ends the request with nothing sent upstream;
4. when any permit is released the limiter calls back here and
   ``queue.dispatch`` hands free permits to the best waiters. A permit that
   reaches a waiter which has just gone is passed on, never leaked; a waiter
   granted at the instant its deadline passed gives the permit back and is shed.

Queue outcomes counted: ``admitted`` (granted after waiting), ``timeout``
(deadline or queue timeout in the queue), ``queue_full`` (refused or displaced).
The concurrency stage releases the permit; this stage releases it as IGNORED
only if the inner app returned without doing so (a safety net).
Cancellation is never swallowed: a cancelled waiter leaves the queue, returns
any permit it was granted, and re-raises.

Dry-run (``responder.dry_run``): a request refused with ``queue_full``, a
waiter displaced by a newcomer, and a waiter whose deadline or queue timeout
passes are counted in ``ballast_dry_run_shed_total`` (and the queue outcome as
usual) and proceed *without a permit*: a request still waits up to the queue
timeout, then goes through. The queue and the limiter hold exactly what they
would under enforcement. A request an outer stage already admitted that way
(``ctx.would_shed``) skips the queue.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ballast_asgi.core.limiter import Limiter, Permit
from ballast_asgi.core.outcome import Outcome, ShedReason
from ballast_asgi.core.queue import PriorityQueue, Waiter, dispatch
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import ASGIApp, Clock, Message, Receive, Scope, Send
from ballast_asgi.middleware._asgi import replay, watch_disconnect
from ballast_asgi.middleware.context import RequestContext, get_context
from ballast_asgi.middleware.limit_route import limit_route
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.metrics import Metrics

#: The result a waiter's future gets when its client disconnects.
GONE = "client_gone"
_TIMEOUT_REASONS = (ShedReason.DEADLINE, ShedReason.QUEUE_TIMEOUT)


class QueueStage:
    """The queue stage's decisions: wait for a permit, or shed (``queue_full``, timeouts)."""

    def __init__(
        self,
        limiter: Limiter,
        queue: PriorityQueue,
        responder: ShedResponder,
        metrics: Metrics,
        queue_timeout_ms: float | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if queue_timeout_ms is not None and queue_timeout_ms <= 0:
            raise ValueError(f"queue_timeout_ms must be > 0, got {queue_timeout_ms}")
        self.limiter = limiter
        self.queue = queue
        self.responder = responder
        self.metrics = metrics
        self.queue_timeout_s = None if queue_timeout_ms is None else queue_timeout_ms / 1000.0
        self.clock = clock
        limiter.set_on_release(self._on_release)
        metrics.bind_queue_depth(queue.depth)

    async def run(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, ctx: RequestContext
    ) -> None:
        """Run ``app`` with the permit the request holds; release it IGNORED if ``app`` did not."""
        permit = ctx.permit
        try:
            await app(scope, receive, send)
        finally:
            if permit is not None and not permit.released:
                permit.release(Outcome.IGNORED, self.clock())

    async def wait_then_run(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, ctx: RequestContext,
        now: float,
    ) -> None:  # fmt: skip
        """No permit was free at ``now``: queue, then run ``app`` or shed (dry-run: ``app``)."""
        if ctx.deadline is not None and ctx.deadline <= now:
            shed = Shed(ShedReason.DEADLINE, ctx.priority)
            await self.responder.act(shed, ctx, app, scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        timeout_at = None if self.queue_timeout_s is None else now + self.queue_timeout_s
        route = limit_route(scope, ctx)
        waiter = Waiter(ctx.priority, now, ctx.deadline, timeout_at, loop.create_future(), route)
        pushed = self.queue.push(waiter)
        if pushed.displaced is not None:
            self._leave(pushed.displaced, ShedReason.QUEUE_FULL)
        if not pushed.accepted:
            self.metrics.count_queued("queue_full")
            shed = Shed(ShedReason.QUEUE_FULL, ctx.priority)
            await self.responder.act(shed, ctx, app, scope, receive, send)
            return
        buffered: list[Message] = []
        result = await self._wait(waiter, receive, buffered, loop)
        await self._after_wait(app, scope, replay(buffered, receive), send, ctx, waiter, result)

    async def _after_wait(
        self,
        app: ASGIApp,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: RequestContext,
        waiter: Waiter,
        result: Any,
    ) -> None:
        now = self.clock()
        if result == GONE:
            return
        ctx.queue_wait_s = now - waiter.enqueued_at
        self.metrics.observe_queue_wait(ctx.priority, ctx.queue_wait_s)
        if isinstance(result, Permit) and ctx.deadline is not None and ctx.deadline <= now:
            result.release(Outcome.IGNORED, now)  # granted as it expired: pass the slot on
            result = ShedReason.DEADLINE
        if isinstance(result, ShedReason):
            self.metrics.count_queued("timeout" if result in _TIMEOUT_REASONS else "queue_full")
            shed = Shed(result, ctx.priority)
            await self.responder.act(shed, ctx, app, scope, receive, send)
            return
        self.metrics.count_queued("admitted")
        ctx.permit = result
        await self.run(app, scope, receive, send, ctx)

    async def _wait(
        self,
        waiter: Waiter,
        receive: Receive,
        buffered: list[Message],
        loop: asyncio.AbstractEventLoop,
    ) -> Any:
        future: asyncio.Future[Any] = waiter.handle
        timer = self._arm_timer(waiter, loop)
        watcher = watch_disconnect(receive, lambda: self._leave(waiter, GONE), buffered)
        try:
            return await future
        except BaseException:
            self._abandon(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            watcher.cancel()

    def _arm_timer(
        self, waiter: Waiter, loop: asyncio.AbstractEventLoop
    ) -> asyncio.TimerHandle | None:
        expiry = waiter.expiry()
        if expiry is None:
            return None
        when, reason = expiry
        return loop.call_at(loop.time() + (when - self.clock()), self._leave, waiter, reason)

    def _leave(self, waiter: Waiter, result: Any) -> None:
        """Take ``waiter`` out of the queue and wake it with ``result`` (first one wins)."""
        self.queue.remove(waiter)
        future: asyncio.Future[Any] = waiter.handle
        if not future.done():
            future.set_result(result)

    def _abandon(self, waiter: Waiter) -> None:
        """A cancelled waiter: leave the queue and hand back any permit it got."""
        self.queue.remove(waiter)
        future: asyncio.Future[Any] = waiter.handle
        if future.done() and not future.cancelled() and isinstance(future.result(), Permit):
            future.result().release(Outcome.IGNORED, self.clock())
        elif not future.done():
            future.cancel()

    def _on_release(self, now: float) -> None:
        if self.queue.total:  # nobody waiting (the common case): ``dispatch`` grants nothing
            dispatch(self.queue, self.limiter, now, _deliver)


def _deliver(waiter: Waiter, permit: Permit) -> bool:
    future: asyncio.Future[Any] = waiter.handle
    if future.done():
        return False
    future.set_result(permit)
    return True


class QueueMiddleware:
    """Priority queue in front of the concurrency limiter (``QueueStage``)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: Limiter,
        queue: PriorityQueue,
        responder: ShedResponder,
        metrics: Metrics,
        queue_timeout_ms: float | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.app = app
        self.stage = QueueStage(limiter, queue, responder, metrics, queue_timeout_ms, clock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request now, after a wait, or shed it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = get_context(scope)
        stage = self.stage
        if ctx.permit is None and not ctx.would_shed:
            now = stage.clock()
            permit = stage.limiter.try_acquire(now, limit_route(scope, ctx))
            if permit is None:
                await stage.wait_then_run(self.app, scope, receive, send, ctx, now)
                return
            ctx.permit = permit
        await stage.run(self.app, scope, receive, send, ctx)
