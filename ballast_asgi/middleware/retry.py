"""RetryMiddleware: replace a failed attempt, decided at the response head.

Sits outside ``BreakerMiddleware`` (which holds one breaker ticket per attempt)
and inside the concurrency stage (one permit covers every attempt). Per request:

1. One attempt only (a plain pass-through) when retries are off or the
   request has a body the body stage could not buffer (``ctx.body is None``):
   such a body cannot be replayed. A request whose method is not idempotent
   (GET HEAD OPTIONS PUT DELETE, or an ``Idempotency-Key`` header) is retried
   only after a ``CONNECT_ERROR``: the connection was never made, so the
   upstream saw nothing (Envoy's ``connect-failure``), and with a pool the
   next attempt goes to another instance.
2. Otherwise every attempt after the first replays ``ctx.body`` (empty when
   the request has none). When the attempt's response
   head arrives, its ``AttemptOutcome`` (recorded by the proxy or app before
   the head; from the status when nobody did) decides:

   * **commit** (the default): the head and the body stream to the client as
     they come. Nothing retries or rewrites it after this point; a failure
     mid-body propagates (the server aborts the connection, the truncation is
     visible).
   * **swallow**: the outcome is retryable (``is_retryable``; a status also has
     to be in ``retry_statuses``), attempts are left, the client is still
     there, the deadline leaves room for the backoff plus ``min_attempt_ms``,
     the breaker would admit another attempt and the budget grants a retry.
     That response is held (up to ``max_buffer_bytes``, counted in the byte
     budget; beyond it, it is committed after all) and dropped once the
     attempt ends; after a full-jitter backoff
     ``uniform(0, min(backoff_max, backoff_base * 2**attempt))`` cut to the
     deadline, the next attempt runs. If the breaker opened during the backoff,
     the held response is sent instead.

3. An attempt that raises before any head: when its recorded outcome is
   retryable it is retried like a swallowed head; otherwise the error
   propagates. The gateway's own errors (``GATEWAY_ERROR``, nothing recorded)
   are never retried.

Dry-run admitted requests (``ctx.would_shed``) get one attempt.

Per route: a request whose route sets retry overrides (``routes[].retry``,
resolved once into ``ctx.route.retry``) is retried by those settings
(attempts, statuses, backoff, buffer); the budget is the gateway's, shared.

Each attempt's ``send`` (the head decision, holding) is an ``Attempt``
(``middleware/retry_attempt.py``): a first success passes straight through.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from ballast_asgi.config import RetryConfig
from ballast_asgi.core.capacity import ByteBudget
from ballast_asgi.core.outcome import RETRYABLE, AttemptOutcome
from ballast_asgi.core.retry_budget import RetryBudget
from ballast_asgi.core.routes import Route
from ballast_asgi.core.types import ASGIApp, Clock, Receive, Scope, Send
from ballast_asgi.middleware._asgi import body_message, replay
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.context import LEAVING, RequestContext, find_context
from ballast_asgi.middleware.retry_attempt import Attempt, RetryPolicy
from ballast_asgi.telemetry.metrics import Metrics

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})

Sleep = Callable[[float], Awaitable[None]]
#: Whether the breaker would admit another attempt for this request now.
AttemptGate = Callable[[RequestContext, float], bool]


def _always(ctx: RequestContext, now: float) -> bool:
    return True


class RetryStage:
    """The retry stage's decisions: whether to retry, each attempt's fate at its head."""

    def __init__(
        self,
        *,
        budget: RetryBudget,
        metrics: Metrics,
        config: RetryConfig | None = None,
        gate: AttemptGate = _always,
        byte_budget: ByteBudget | None = None,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        sleep: Sleep = asyncio.sleep,
        min_attempt_ms: int = 20,
    ) -> None:
        cfg = config if config is not None else RetryConfig()
        if min_attempt_ms < 0:
            raise ValueError(f"min_attempt_ms must be >= 0, got {min_attempt_ms}")
        self._budget = budget
        self._metrics = metrics
        self._gate = gate
        self._default = RetryPolicy.of(cfg)
        self._by_route: dict[str, RetryPolicy] = {}
        self._bytes = byte_budget
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep
        self._min_attempt_s = min_attempt_ms / 1000.0
        metrics.retry_budget_balance.set_function(lambda: budget.balance(clock()))

    def begin(self, scope: Scope, ctx: RequestContext) -> bool:
        """Whether the request may get several attempts (then counted as an original)."""
        route = ctx.route
        policy = self._default if route is None or route.retry is None else self.route_policy(route)
        if policy.max_attempts <= 1 or ctx.would_shed:
            return False  # one attempt: retries off, or dry-run admitted
        if ctx.body is None:
            head = ctx.head  # ``head.has_body``, inlined: a body that was not buffered
            if head.chunked or head.content_length:
                return False
        self._budget.record_original(self._clock())
        return True

    def policy(self, ctx: RequestContext) -> RetryPolicy:
        """The retry settings of the request's route (the gateway's unless it overrides them)."""
        return self.route_policy(ctx.route)

    def replays(self, route: Route) -> bool:
        """Whether ``begin`` would give a request on ``route`` several attempts (one that
        is not dry-run and has no body to buffer)."""
        return self.route_policy(route).max_attempts > 1

    def route_policy(self, route: Route | None) -> RetryPolicy:
        """The retry settings of ``route`` (the gateway's unless it overrides them)."""
        if route is None or route.retry is None:
            return self._default
        found = self._by_route.get(route.name)
        if found is None:
            found = self._by_route[route.name] = RetryPolicy.of(route.retry)
        return found

    async def attempts(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, ctx: RequestContext
    ) -> None:
        """Run ``app`` once per attempt until one is kept (after ``begin``; ``ctx`` is the
        scope's). A ``BreakerMiddleware`` is run through its stage, as its ``__call__``
        does for a request not admitted by dry-run: one coroutine less per attempt."""
        inner = receive  # the first attempt reads the request as it comes
        route = ctx.route
        policy = self._default if route is None or route.retry is None else self.route_policy(route)
        idempotent = scope["method"] in IDEMPOTENT_METHODS or bool(ctx.head.idempotency_key)
        breaker = app if type(app) is BreakerMiddleware else None
        while True:
            attempt = Attempt(self, ctx, send, idempotent, policy)
            error: Exception | None = None
            again = False
            try:
                try:
                    if breaker is not None and not ctx.would_shed:
                        await breaker.stage.attempt(breaker.app, scope, inner, attempt.send, ctx)
                    else:
                        await app(scope, inner, attempt.send)
                except Exception as exc:
                    if attempt.passed_on or not attempt.retry_after_raise():
                        raise
                    error = exc
                held = attempt.held  # ``attempt.kept``, inlined
                if error is None and (held is None or held.committed):
                    return  # kept: passed on to the client (or nothing to pass on)
                if not await self._backoff(attempt):
                    if error is not None:
                        attempt.drop()  # the held response (if any) goes with the error
                        raise error
                    await attempt.flush()
                    return
                again = True
            finally:
                if not again and attempt.granted_at is not None:
                    self.unspent(attempt)  # granted, but no next attempt runs on it
            attempt.drop()
            ctx.next_attempt()
            inner = replay([body_message(ctx.body or b"")], receive)

    async def _backoff(self, attempt: Attempt) -> bool:
        """Sleep before the next attempt; False when the breaker shut or the client left.

        Under the gateway's own server (``LEAVING``) a client that leaves during the
        sleep ends it at once (``ResponseCycle.stop``, taken back here as the proxy takes
        it back at its wait): the permit and the slot are not held for the rest of it."""
        cycle = LEAVING.get()  # the gateway's own server's request cycle, if any
        if cycle is not None and cycle.task is not asyncio.current_task():
            cycle = None  # another task of the request (an app's own): not ours to stop
        if cycle is not None and cycle.disconnected:
            return False  # the client left already: no more upstream work for it
        if attempt.delay_s > 0:
            if cycle is not None:
                cycle.on_gone = cycle.stop
            try:
                await self._sleep(attempt.delay_s)
            except asyncio.CancelledError:
                if cycle is None or not cycle.took_back():
                    raise
                return False  # the client left during the backoff
            finally:
                if cycle is not None:
                    cycle.on_gone = None
            if cycle is not None and cycle.disconnected:
                return False  # the client left meanwhile: no more upstream work for it
        return self._gate(attempt.ctx, self._clock())

    # -- the decision at the head ----------------------------------------------
    def plan(
        self, ctx: RequestContext, status: int | None, idempotent: bool, policy: RetryPolicy
    ) -> tuple[float, float] | None:
        """The backoff before another attempt and the time its retry was granted by the
        budget (``unspent`` gives it back), or None to keep this one."""
        outcome = ctx.outcome
        if outcome is None or outcome not in RETRYABLE:
            return None
        if ctx.attempt + 1 >= policy.max_attempts:
            return None
        if not idempotent and outcome is not AttemptOutcome.CONNECT_ERROR:
            return None
        if outcome is AttemptOutcome.STATUS_5XX and status not in policy.retry_statuses:
            return None
        now = self._clock()
        delay_s = self._delay_s(ctx, now, policy)
        if delay_s is None or not self._gate(ctx, now):
            return None
        if not self._budget.try_acquire_retry(now):
            self._metrics.count_retry("denied")
            return None
        self._metrics.count_retry("attempted")
        return delay_s, now

    def unspent(self, attempt: Attempt) -> None:
        """The retry ``attempt`` was granted did not run: its budget given back."""
        granted_at = attempt.granted_at
        if granted_at is not None:
            attempt.granted_at = None
            self._budget.refund_retry(granted_at)

    def _delay_s(self, ctx: RequestContext, now: float, policy: RetryPolicy) -> float | None:
        """Full-jitter backoff before the next attempt; None when the deadline is too near."""
        cap_s = min(policy.backoff_max_s, policy.backoff_base_s * 2.0**ctx.attempt)
        delay_s = self._rng.uniform(0.0, cap_s) if cap_s > 0 else 0.0
        if ctx.deadline is None:
            return delay_s
        room_s = ctx.deadline - now - self._min_attempt_s
        return None if room_s <= 0 else min(delay_s, room_s)

    def hold_bytes(self, n: int) -> bool:
        """Count ``n`` held response bytes in the byte budget (negative gives back)."""
        if self._bytes is None:
            return True
        if n < 0:
            self._bytes.release(-n)
            return True
        return self._bytes.try_reserve(n)

    def count_head(self, ctx: RequestContext) -> None:
        """A retry whose head is a success counts as ``succeeded``.

        The outcome was recorded by the producer, or by the breaker stage inside
        this one from the status, before the head got here.
        """
        if ctx.attempt > 0 and ctx.outcome is AttemptOutcome.SUCCESS:
            self._metrics.count_retry("succeeded")


class RetryMiddleware:
    """Retry failed idempotent attempts from a budget (``RetryStage`` as a middleware)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        budget: RetryBudget,
        metrics: Metrics,
        config: RetryConfig | None = None,
        gate: AttemptGate = _always,
        byte_budget: ByteBudget | None = None,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        sleep: Sleep = asyncio.sleep,
        min_attempt_ms: int = 20,
    ) -> None:
        self.app = app
        self.stage = RetryStage(
            budget=budget, metrics=metrics, config=config, gate=gate, byte_budget=byte_budget,
            clock=clock, rng=rng, sleep=sleep, min_attempt_ms=min_attempt_ms,
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every attempt of the request, each one a call of the inner app."""
        ctx = find_context(scope) if scope["type"] == "http" else None
        if ctx is None or not self.stage.begin(scope, ctx):
            await self.app(scope, receive, send)
            return
        await self.stage.attempts(self.app, scope, receive, send, ctx)
