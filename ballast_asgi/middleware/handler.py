"""HandlerMiddleware: the in-app end of the stack, around the user's own handlers.

``install()`` / ``wrap()`` put it innermost, where the gateway has its proxy.
It does for a handler what the proxy does for an upstream call:

1. records the attempt's ``AttemptOutcome`` before the response head goes out
   (from the status; the time to the head is the limiter's RTT sample), and
   ``STATUS_5XX`` when the handler raises before any head;
2. enforces the deadline: when ``ctx.deadline`` passes while the handler runs,
   the handler is cancelled, the outcome is ``DEADLINE``,
   ``ballast_handler_deadline_cancelled_total`` counts it, and the client gets
   ``deadline_status`` (default 504) if no head was sent yet (otherwise the
   response is aborted: the truncation is visible). ``cancel_on_deadline:
   false`` lets handlers run past their deadline.

Handlers that pass the budget on read ``ctx.remaining_ms()``
(``get_context(request.scope)`` or ``request.state.ballast``); while the
handler runs, the context is also ``current_context()`` (a contextvar,
reset when the handler returns), which is how ``BallastTransport`` forwards
the deadline and tier of an outgoing call without the caller passing them.
"""

from __future__ import annotations

import asyncio
import time

from ballast_asgi.config.models import DEFAULT_DEADLINE_STATUS
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import ASGIApp, Clock, Message, Receive, Scope, Send
from ballast_asgi.middleware.context import CURRENT_CONTEXT, RequestContext, find_context
from ballast_asgi.middleware.responses import send_json
from ballast_asgi.telemetry.metrics import Metrics


class HandlerMiddleware:
    """Record each handler's outcome; cancel it when the request's deadline passes."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        cancel_on_deadline: bool = True,
        deadline_status: int = DEFAULT_DEADLINE_STATUS,
        clock: Clock = time.monotonic,
    ) -> None:
        if not 400 <= deadline_status <= 599:
            raise ValueError(f"deadline_status must be in 400..599, got {deadline_status}")
        self.app = app
        self._metrics = metrics
        self._cancel = cancel_on_deadline
        self._status = deadline_status
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = find_context(scope) if scope["type"] == "http" else None
        if ctx is None:
            await self.app(scope, receive, send)
            return
        started = self._clock()
        head = False
        clock = self._clock

        async def recording_send(message: Message) -> None:
            nonlocal head
            if message["type"] == "http.response.start" and not head:
                head = True
                ctx.record_status(int(message["status"]), clock() - started)
            await send(message)

        token = CURRENT_CONTEXT.set(ctx)
        try:
            await self._run(scope, receive, recording_send, ctx)
        except _DeadlinePassed:
            self._metrics.handler_deadline_cancelled.inc()
            ctx.record(AttemptOutcome.DEADLINE)
            if head:
                raise
            await send_json(send, self._status, _PAYLOAD)
        except Exception:
            ctx.record(AttemptOutcome.STATUS_5XX)
            raise
        finally:
            CURRENT_CONTEXT.reset(token)

    async def _run(self, scope: Scope, receive: Receive, send: Send, ctx: RequestContext) -> None:
        if not self._cancel or ctx.deadline is None:
            await self.app(scope, receive, send)
            return
        timeout = asyncio.timeout(max(0.0, ctx.deadline - self._clock()))
        try:
            async with timeout:
                await self.app(scope, receive, send)
        except TimeoutError:
            if timeout.expired():
                raise _DeadlinePassed from None
            raise


class _DeadlinePassed(Exception):
    """The request's deadline passed while its handler ran."""


_PAYLOAD: dict[str, object] = {
    "error": "gateway_timeout",
    "message": "the request's deadline (X-Deadline-Ms) passed while the handler ran",
}
