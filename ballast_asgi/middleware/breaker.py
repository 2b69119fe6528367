"""Stage four adapter: circuit breaker plus retries drawn from a budget.

Per request:

1. The breaker is asked first, before the body is read: while it is open (or
   half-open with its probe out) the request is shed at once with reason
   ``breaker_open`` and ``Retry-After`` = the remaining open time.
2. Buffered mode (``RetryConfig.buffer_responses``, the default): the request
   body is read in full (up to ``max_buffer_bytes``; a larger body falls back
   to one streamed attempt) so it can be replayed; each attempt's response is
   held in memory and only the kept attempt reaches the client.
3. Every attempt holds one breaker ticket, settled exactly once. An attempt
   fails when ``ctx.upstream_error`` is ``connect``/``timeout``/``protocol``,
   the status is one of the breaker's failure statuses, or the inner app
   raised; a 4xx is a success. A ``deadline`` error (the request's own
   X-Deadline-Ms ran out) says nothing about the upstream's health: the ticket
   is cancelled, and it is not retried (there is no time left).
4. A failed attempt is retried only if: the method is idempotent (GET HEAD
   OPTIONS PUT DELETE, or an ``Idempotency-Key`` header), the failure is
   retryable (an upstream error -- connect, timeout, or protocol, i.e. the
   proxy's 502 or a reset mid-body --, a status in ``retry_statuses``, default
   502/503/504, or the inner app raising), nothing reached the
   client yet, ``max_attempts`` is not used up, the deadline leaves room for
   the backoff plus ``min_attempt_ms``, the breaker gives a ticket (a
   half-open breaker only if the retry can be the probe) and the budget
   grants a retry. Backoff is full-jitter exponential:
   ``uniform(0, min(backoff_max, backoff_base * 2**attempt))``, cut to the
   deadline.
5. The commit point: once more than ``max_buffer_bytes`` of response are held
   (or an unknown message type is sent), what is held is flushed and the rest
   streams; that attempt can no longer be replaced.

Streaming mode (``buffer_responses: false``) passes everything through in one
attempt: no retries, the breaker still records the outcome.

Dry-run (``responder.dry_run``): a request the open breaker would shed is
counted in ``ballast_dry_run_shed_total`` and goes upstream once, with no
ticket (nothing is recorded into the breaker) and no retries; so does one an
outer stage already admitted that way (``ctx.would_shed``). Its concurrency
permit is handed back first (released IGNORED, ``ctx.permit`` cleared), as the
shed would have done, so the limiter sees what it would under enforcement.

The stage reads the ``RequestContext`` when admission runs in front of it (it
should: admission supplies the deadline that bounds retries). Without one it
still works, with no deadline and the standard priority.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from ballast_asgi.config import RetryConfig
from ballast_asgi.core.breaker import Breaker, BreakerState, Ticket
from ballast_asgi.core.outcome import Outcome, ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.retry_budget import RetryBudget
from ballast_asgi.core.types import ASGIApp, Clock, Message, Receive, Scope, Send
from ballast_asgi.metrics import Metrics
from ballast_asgi.middleware.context import RequestContext, find_context
from ballast_asgi.middleware.responses import ShedResponder

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
IDEMPOTENCY_KEY = b"idempotency-key"
#: Upstream errors (``ctx.upstream_error``): each is a breaker failure and retryable.
#: A protocol error is the proxy's 502, or a reset mid-body: before the commit
#: point the client has seen nothing, so it is replaced like any 502.
UPSTREAM_ERRORS = frozenset({"connect", "timeout", "protocol"})
DEFAULT_RETRY_STATUSES = (502, 503, 504)

Sleep = Callable[[float], Awaitable[None]]


@dataclass(slots=True, frozen=True)
class _Verdict:
    failure: bool
    retryable: bool
    #: Says nothing about the upstream's health (the request's own deadline ran out).
    neutral: bool = False


_DEADLINE = _Verdict(failure=True, retryable=False, neutral=True)
#: The other verdicts, built once (indexed by ``(failure, retryable)``).
_VERDICTS = {(f, r): _Verdict(failure=f, retryable=r) for f in (False, True) for r in (False, True)}
_SUCCESS = _VERDICTS[(False, False)]
_UNRETRYABLE = _VERDICTS[(True, False)]
_RETRYABLE = _VERDICTS[(True, True)]


class _Response:
    """One attempt's response, held until the stage keeps it or drops it."""

    __slots__ = ("_held", "_limit", "_send", "committed", "size", "status")

    def __init__(self, send: Send, limit_bytes: int) -> None:
        self._send = send
        self._limit = limit_bytes
        self._held: list[Message] = []
        self.size = 0
        self.status: int | None = None
        self.committed = False

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
        if self.committed:
            await self._send(message)
            return
        if kind == "http.response.body":
            self.size += len(message.get("body", b""))
        self._held.append(message)
        if self.size > self._limit or kind not in ("http.response.start", "http.response.body"):
            await self.flush()

    async def flush(self) -> None:
        """Send what is held and stream from now on (the commit point)."""
        self.committed = True
        held, self._held = self._held, []
        for message in held:
            await self._send(message)


class _Request:
    """The buffered request: replays its body to each attempt."""

    __slots__ = ("_receive", "body", "ctx", "gone", "idempotent")

    def __init__(self, scope: Scope, receive: Receive, ctx: RequestContext | None) -> None:
        self._receive = receive
        self.ctx = ctx
        self.body = b""
        self.gone = False
        self.idempotent = scope["method"] in IDEMPOTENT_METHODS or any(
            name.lower() == IDEMPOTENCY_KEY for name, _ in scope.get("headers", ())
        )

    async def read(self, limit_bytes: int) -> list[Message] | None:
        """Read the body; None when complete, else the messages read (too big or gone)."""
        message = await self.receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            body = message.get("body", b"")  # the common case: one complete message
            self.body = body if type(body) is bytes else bytes(body)
            return None
        return await self._read_rest(message, limit_bytes)

    async def _read_rest(self, message: Message, limit_bytes: int) -> list[Message] | None:
        chunks: list[Message] = []
        size = 0
        while True:
            if message["type"] != "http.request":
                return [*chunks, message]
            chunks.append(message)
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.body = b"".join(m.get("body", b"") for m in chunks)
                return None
            if size > limit_bytes:
                return chunks
            message = await self.receive()

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.gone = True
            if self.ctx is not None:
                self.ctx.client_gone = True
        return message

    def replay(self) -> Receive:
        pending = [{"type": "http.request", "body": self.body, "more_body": False}]

        async def receive() -> Message:
            return pending.pop() if pending else await self.receive()

        return receive


def _prepend(messages: list[Message], receive: Receive) -> Receive:
    pending = list(reversed(messages))

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


class BreakerMiddleware:
    """Shed while the breaker is open; retry failed idempotent attempts from a budget."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        breaker: Breaker,
        budget: RetryBudget,
        responder: ShedResponder,
        metrics: Metrics,
        config: RetryConfig | None = None,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        sleep: Sleep = asyncio.sleep,
        retry_statuses: Collection[int] = DEFAULT_RETRY_STATUSES,
        min_attempt_ms: int = 20,
    ) -> None:
        cfg = config if config is not None else RetryConfig()
        if min_attempt_ms < 0:
            raise ValueError(f"min_attempt_ms must be >= 0, got {min_attempt_ms}")
        self.app = app
        self._breaker = breaker
        self._budget = budget
        self._responder = responder
        self._metrics = metrics
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep
        self._retry_statuses = frozenset(retry_statuses)
        self._max_attempts = cfg.max_attempts if cfg.enabled else 1
        self._buffered = cfg.buffer_responses and self._max_attempts > 1
        self._max_buffer_bytes = cfg.max_buffer_bytes
        self._backoff_base_s = cfg.backoff_base_ms / 1000.0
        self._backoff_max_s = cfg.backoff_max_ms / 1000.0
        self._min_attempt_s = min_attempt_ms / 1000.0
        _bind_metrics(metrics, breaker, budget, clock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = find_context(scope)
        if ctx is not None and ctx.would_shed:  # dry-run: admitted outside every limit
            await self.app(scope, receive, send)
            return
        if not self._breaker.can_acquire(self._clock()):
            if not await self._shed(send, ctx):
                await self.app(scope, receive, send)
            return
        request = _Request(scope, receive, ctx)
        leftover = await request.read(self._max_buffer_bytes) if self._buffered else []
        if request.gone:
            return
        now = self._clock()
        ticket = self._breaker.acquire(now)
        if ticket is None:
            if not await self._shed(send, ctx):
                replay = request.replay() if leftover is None else request.receive
                await self.app(scope, _prepend(leftover or [], replay), send)
            return
        self._budget.record_original(now)
        if leftover is None:
            await self._attempts(scope, request, send, ticket)
        else:
            await self._stream(scope, _prepend(leftover, request.receive), send, request, ticket)

    async def _shed(self, send: Send, ctx: RequestContext | None) -> bool:
        """The single shed point of this stage; False when dry-run admits the request."""
        priority = Priority.STANDARD if ctx is None else ctx.priority
        retry_after_s = self._breaker.retry_after_s(self._clock())
        reason = ShedReason.BREAKER_OPEN
        if await self._responder.refuse(send, ctx, reason, priority, retry_after_s):
            if ctx is not None:
                ctx.outcome = Outcome.IGNORED
            return True
        if ctx is not None and ctx.permit is not None:  # dry-run: hand it back, as a shed would
            permit, ctx.permit = ctx.permit, None
            permit.release(Outcome.IGNORED, self._clock())
        return False

    # -- streaming: one attempt, passed through --------------------------------
    async def _stream(
        self, scope: Scope, receive: Receive, send: Send, request: _Request, ticket: Ticket
    ) -> None:
        response = _Response(send, limit_bytes=0)
        response.committed = True
        _reset(request.ctx, 0)
        _, error = await self._attempt(scope, receive, response, request, ticket)
        if error is not None:
            raise error

    # -- buffered: attempts replayed until one is kept --------------------------
    async def _attempts(self, scope: Scope, request: _Request, send: Send, ticket: Ticket) -> None:
        attempt = 0
        while True:
            _reset(request.ctx, attempt)
            response = _Response(send, self._max_buffer_bytes)
            verdict, error = await self._attempt(scope, request.replay(), response, request, ticket)
            if attempt > 0 and not verdict.failure:
                self._metrics.count_retry("succeeded")
            next_ticket = await self._retry_ticket(request, response, verdict, attempt)
            if next_ticket is None:
                break
            ticket = next_ticket
            attempt += 1
        if error is not None:
            raise error
        await response.flush()

    async def _attempt(
        self,
        scope: Scope,
        receive: Receive,
        response: _Response,
        request: _Request,
        ticket: Ticket,
    ) -> tuple[_Verdict, Exception | None]:
        """Run the inner app once and settle its ticket exactly once."""
        error: Exception | None = None
        try:
            try:
                await self.app(scope, receive, response.send)
            except Exception as exc:
                error = exc
            verdict = self._classify(response, request, error)
        except BaseException:
            ticket.cancel()
            raise
        if (request.gone and response.status is None) or verdict.neutral:
            ticket.cancel()
        else:
            ticket.record(not verdict.failure, self._clock())
        if verdict.failure and request.ctx is not None:
            request.ctx.outcome = Outcome.DROPPED
        return verdict, error

    def _classify(
        self, response: _Response, request: _Request, error: Exception | None
    ) -> _Verdict:
        kind = request.ctx.upstream_error if request.ctx is not None else None
        if kind == "deadline":
            return _DEADLINE
        if error is not None or kind in UPSTREAM_ERRORS:
            return _RETRYABLE
        status = response.status
        if status is None:
            return _UNRETRYABLE
        if not self._breaker.is_failure_status(status):
            return _SUCCESS
        return _RETRYABLE if status in self._retry_statuses else _UNRETRYABLE

    def _may_retry(self, request: _Request, verdict: _Verdict) -> bool:
        """The request-local conditions for another attempt (not budget or breaker)."""
        return (
            self._buffered
            and verdict.failure
            and verdict.retryable
            and request.idempotent
            and not request.gone
        )

    async def _retry_ticket(
        self, request: _Request, response: _Response, verdict: _Verdict, attempt: int
    ) -> Ticket | None:
        """A ticket for one more attempt (after its backoff), or None to keep this one."""
        if response.committed or attempt + 1 >= self._max_attempts:
            return None
        if not self._may_retry(request, verdict):
            return None
        now = self._clock()
        delay_s = self._backoff_s(attempt, now, request.ctx)
        if delay_s is None:
            return None
        ticket = self._breaker.acquire(now)
        if ticket is None:
            return None
        if not self._budget.try_acquire_retry(now):
            ticket.cancel()
            self._metrics.count_retry("denied")
            return None
        self._metrics.count_retry("attempted")
        if delay_s > 0:
            try:
                await self._sleep(delay_s)
            except BaseException:
                ticket.cancel()
                raise
        return ticket

    def _backoff_s(self, attempt: int, now: float, ctx: RequestContext | None) -> float | None:
        """Full-jitter backoff before retry ``attempt + 1``; None when the deadline is too near."""
        cap_s = min(self._backoff_max_s, self._backoff_base_s * 2.0**attempt)
        delay_s = self._rng.uniform(0.0, cap_s) if cap_s > 0 else 0.0
        if ctx is None or ctx.deadline is None:
            return delay_s
        room_s = ctx.deadline - now - self._min_attempt_s
        if room_s <= 0:
            return None
        return min(delay_s, room_s)


def _reset(ctx: RequestContext | None, attempt: int) -> None:
    if ctx is not None:
        ctx.attempt = attempt
        ctx.upstream_error = None
        ctx.outcome = None


def _bind_metrics(metrics: Metrics, breaker: Breaker, budget: RetryBudget, clock: Clock) -> None:
    metrics.bind_breaker(
        lambda: breaker.state(clock()).value, lambda: breaker.seconds_in_state(clock())
    )
    metrics.retry_budget_balance.set_function(lambda: budget.balance(clock()))
    for state in BreakerState:
        metrics.breaker_transitions.labels(state.value)

    def count(old: BreakerState, new: BreakerState, at: float) -> None:
        metrics.breaker_transitions.labels(new.value).inc()

    breaker.set_on_transition(count)
