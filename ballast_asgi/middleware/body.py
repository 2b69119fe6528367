"""BodyMiddleware: read a request body before it takes a queue slot or a permit.

Sits inside ``CapacityMiddleware`` and outside the queue, so a client that
trickles its body holds no queue slot, no concurrency permit and no breaker
ticket while it does. Requests without a body (no Content-Length, or 0, and
no Transfer-Encoding: the common GET) pass straight through at no cost.

For a request with a body:

1. Up to ``replay_max_bytes`` are read and buffered (each chunk counted in the
   shared ``ByteBudget`` as it arrives, given back when the request ends).
   Every chunk must arrive within ``read_timeout_ms`` of the previous one, and
   the body as a whole at ``min_rate_bytes_per_s`` after that grace:
   ``elapsed <= read_timeout + received / min_rate``. A client that is slower
   gets **408** (``ballast_body_timeouts_total{phase="buffer"}``), a body
   larger than ``max_body_bytes`` **413**; a client that disconnects gets
   nothing and costs nothing. A chunk the byte budget cannot hold is a
   ``capacity`` shed (``Shed`` acted on by ``ShedResponder.act``: 429; in
   dry-run counted once and the request goes on with the chunks read so far,
   the rest streamed as in 3, outside every later limit).
2. A body that fits is complete in ``ctx.body`` (the retry stage replays it)
   and the inner app receives it as one message.
3. A larger body streams: the inner app gets the chunks read so far, then the
   rest from the client, each chunk again within ``read_timeout_ms``; a
   client that stalls there is treated as gone (the inner app sees
   ``http.disconnect``; ``phase="stream"``). Such a request is not retried.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ballast_asgi.core.capacity import ByteBudget
from ballast_asgi.core.head import (
    DEFAULT_MIN_RATE_BYTES_PER_S,
    DEFAULT_READ_TIMEOUT_MS,
    DEFAULT_REPLAY_MAX_BYTES,
)
from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import ASGIApp, Clock, Message, Receive, Scope, Send
from ballast_asgi.middleware._asgi import DISCONNECT, body_message, replay
from ballast_asgi.middleware.context import RequestContext, find_context
from ballast_asgi.middleware.responses import ShedResponder, send_json
from ballast_asgi.telemetry.metrics import Metrics

#: ``wait(receive(), seconds)``: the message, or ``TimeoutError`` (injectable for tests).
Wait = Callable[[Awaitable[Message], float], Awaitable[Message]]


async def wait_for(message: Awaitable[Message], seconds: float) -> Message:
    """The next message within ``seconds``, else ``TimeoutError``."""
    async with asyncio.timeout(max(0.0, seconds)):
        return await message


class _Refused(Exception):
    def __init__(self, status: int, payload: dict[str, object]) -> None:
        self.status = status
        self.payload = payload


class _Gone(Exception):
    pass


class _OverBudget(Exception):
    """The byte budget is full: a ``capacity`` shed, with the chunks read so far."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages


class BodyStage:
    """The body stage's decisions: buffer a bounded, replayable body under a timeout and rate."""

    def __init__(
        self,
        *,
        responder: ShedResponder,
        metrics: Metrics,
        byte_budget: ByteBudget | None = None,
        replay_max_bytes: int = DEFAULT_REPLAY_MAX_BYTES,
        max_body_bytes: int | None = None,
        read_timeout_ms: int = DEFAULT_READ_TIMEOUT_MS,
        min_rate_bytes_per_s: int = DEFAULT_MIN_RATE_BYTES_PER_S,
        clock: Clock = time.monotonic,
        wait: Wait = wait_for,
    ) -> None:
        if replay_max_bytes < 0 or read_timeout_ms < 1 or min_rate_bytes_per_s < 1:
            raise ValueError(
                "replay_max_bytes must be >= 0, read_timeout_ms >= 1 and "
                f"min_rate_bytes_per_s >= 1, got {replay_max_bytes}, {read_timeout_ms}, "
                f"{min_rate_bytes_per_s}"
            )
        self._responder = responder
        self._metrics = metrics
        self._bytes = byte_budget if byte_budget is not None else ByteBudget(2**62)
        self._replay_max = replay_max_bytes
        self._max_body = max_body_bytes
        self._gap_s = read_timeout_ms / 1000.0
        self._rate = float(min_rate_bytes_per_s)
        self._clock = clock
        self._wait = wait

    async def run(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, ctx: RequestContext
    ) -> None:
        """Read the body of a request that has one, then run ``app`` (or refuse, or shed)."""
        held: list[int] = [0]
        try:
            messages = await self._buffer(receive, held)
        except _Gone:
            self._bytes.release(held[0])
            return
        except _Refused as refused:
            self._bytes.release(held[0])
            await send_json(send, refused.status, refused.payload, [(b"connection", b"close")])
            return
        except _OverBudget as over:
            shed = Shed(ShedReason.CAPACITY, ctx.priority)
            inner = self._inner_receive(ctx, over.messages, receive)
            try:  # the bytes held so far go back when the request ends
                await self._responder.act(shed, ctx, app, scope, inner, send)
            finally:
                self._bytes.release(held[0])
            return
        try:
            await app(scope, self._inner_receive(ctx, messages, receive), send)
        finally:
            self._bytes.release(held[0])

    async def _buffer(self, receive: Receive, held: list[int]) -> list[Message]:
        """Read until the body ends or passes ``replay_max_bytes``."""
        start = self._clock()
        messages: list[Message] = []
        size = 0
        while True:
            room_s = min(self._gap_s, start + self._gap_s + size / self._rate - self._clock())
            message = await self._next(receive, room_s, "buffer")
            if message["type"] != "http.request":
                raise _Gone
            n = len(message.get("body", b""))
            if self._max_body is not None and size + n > self._max_body:
                raise _Refused(
                    413, {"error": "payload_too_large", "max_body_bytes": self._max_body}
                )
            size += n
            messages.append(message)
            if not self._bytes.try_reserve(n):
                raise _OverBudget(messages)
            held[0] += n
            if not message.get("more_body", False) or size > self._replay_max:
                return messages

    async def _next(self, receive: Receive, seconds: float, phase: str) -> Message:
        try:
            return await self._wait(receive(), seconds)
        except TimeoutError:
            self._metrics.body_timeouts.labels(phase).inc()
            if phase == "buffer":
                raise _Refused(408, {"error": "request_timeout"}) from None
            return DISCONNECT

    def _inner_receive(
        self, ctx: RequestContext, messages: list[Message], receive: Receive
    ) -> Receive:
        last = messages[-1]
        if not last.get("more_body", False):
            body = b"".join(m.get("body", b"") for m in messages)
            ctx.body = body
            return replay([body_message(body)], receive)

        async def stream() -> Message:
            return await self._next(receive, self._gap_s, "stream")

        return replay(messages, stream)


class BodyMiddleware:
    """The request body read before the queue (``BodyStage`` as a middleware)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        responder: ShedResponder,
        metrics: Metrics,
        byte_budget: ByteBudget | None = None,
        replay_max_bytes: int = DEFAULT_REPLAY_MAX_BYTES,
        max_body_bytes: int | None = None,
        read_timeout_ms: int = DEFAULT_READ_TIMEOUT_MS,
        min_rate_bytes_per_s: int = DEFAULT_MIN_RATE_BYTES_PER_S,
        clock: Clock = time.monotonic,
        wait: Wait = wait_for,
    ) -> None:
        self.app = app
        self.stage = BodyStage(
            responder=responder, metrics=metrics, byte_budget=byte_budget,
            replay_max_bytes=replay_max_bytes, max_body_bytes=max_body_bytes,
            read_timeout_ms=read_timeout_ms, min_rate_bytes_per_s=min_rate_bytes_per_s,
            clock=clock, wait=wait,
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass a body-less request on; read the body of one that has it first."""
        ctx = find_context(scope) if scope["type"] == "http" else None
        if ctx is None or not ctx.head.has_body:
            await self.app(scope, receive, send)
            return
        await self.stage.run(self.app, scope, receive, send, ctx)
