"""RetryStage.attempts: how an attempt's messages reach the client, and what it gives back.

The success path passes each message straight on (no holding); a swallowed head
holds the response in the byte budget and gives every held byte back however the
attempt ends; the breaker middleware is called through its stage exactly when
its own ``__call__`` would call it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from ballast_asgi.config import RetryConfig
from ballast_asgi.core.breaker import Breaker
from ballast_asgi.core.capacity import ByteBudget
from ballast_asgi.core.head import HeadLimits, read_head
from ballast_asgi.core.outcome import AttemptOutcome, ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.retry_budget import RetryBudget
from ballast_asgi.core.types import Message, Receive, Scope, Send
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.context import RequestContext, find_context, with_context
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.middleware.retry import RetryMiddleware
from ballast_asgi.telemetry.metrics import null_metrics
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

HEAD_503: Message = {"type": "http.response.start", "status": 503, "headers": []}
HEAD_200: Message = {"type": "http.response.start", "status": 200, "headers": []}


def _ctx(clock: FakeClock, scope: Scope) -> tuple[RequestContext, Scope]:
    head = read_head(scope["headers"], HeadLimits())
    ctx = RequestContext(arrival=clock(), deadline=clock() + 5.0, priority=Priority.BULK, head=head)
    return ctx, with_context(scope, ctx)


def _scope() -> Scope:
    return {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _retry(app: Any, clock: FakeClock, **kw: Any) -> RetryMiddleware:
    async def no_sleep(seconds: float) -> None:
        clock.now += seconds

    return RetryMiddleware(
        app, budget=RetryBudget(min_retries_per_s=10.0), metrics=null_metrics(),
        config=RetryConfig(backoff_base_ms=10, backoff_max_ms=20), clock=clock,
        rng=random.Random(1), sleep=no_sleep, **kw,
    )  # fmt: skip


async def test_a_success_passes_each_message_to_the_client_as_sent() -> None:
    """A first attempt's success reaches the client's send message by message, the same
    objects in order, each before the app sends the next, with no byte held."""
    clock = FakeClock()
    sent: list[Message] = []
    seen_when_sending: list[int] = []
    body: Message = {"type": "http.response.body", "body": b"x" * 1024, "more_body": False}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        find_context(scope).record(AttemptOutcome.SUCCESS)  # type: ignore[union-attr]
        await send(HEAD_200)
        seen_when_sending.append(len(sent))
        await send(body)

    async def send(message: Message) -> None:
        sent.append(message)

    bytes_held = ByteBudget(1 << 20)
    mw = _retry(app, clock, byte_budget=bytes_held)
    _, scope = _ctx(clock, _scope())
    await mw(scope, _receive, send)
    assert sent == [HEAD_200, body] and sent[1] is body and seen_when_sending == [1]
    assert bytes_held.peak_bytes == 0
    assert mw.stage._budget.snapshot(clock())["originals_in_window"] == 1


async def test_held_bytes_go_back_when_a_held_attempt_raises_and_the_breaker_shuts() -> None:
    """A swallowed 503 whose attempt then raises, with the breaker shut during the backoff:
    the error propagates and every byte the attempt held is back in the byte budget."""
    clock = FakeClock()
    gate_answers = [True, False]  # admits at the head, shut after the backoff

    def gate(ctx: RequestContext, now: float) -> bool:
        return gate_answers.pop(0)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        find_context(scope).record(AttemptOutcome.STATUS_5XX)  # type: ignore[union-attr]
        await send(HEAD_503)
        await send({"type": "http.response.body", "body": b"held", "more_body": True})
        raise ConnectionResetError("upstream reset after the head")

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    bytes_held = ByteBudget(1 << 20)
    mw = _retry(app, clock, byte_budget=bytes_held, gate=gate)
    _, scope = _ctx(clock, _scope())
    with pytest.raises(ConnectionResetError):
        await mw(scope, _receive, send)
    assert bytes_held.peak_bytes == 4 and bytes_held.used_bytes == 0
    assert sent == [] and gate_answers == []


def _breaker_mw(inner: Any, clock: FakeClock, cls: type[BreakerMiddleware]) -> BreakerMiddleware:
    breaker = Breaker(min_failing_clients=1, consecutive_failures=1)
    breaker.acquire(clock(), None).record(False, clock())  # type: ignore[union-attr]
    responder = ShedResponder(null_metrics(), rng=random.Random(0))
    return cls(inner, breaker=breaker, responder=responder, metrics=null_metrics(), clock=clock)


async def test_a_dry_run_admitted_attempt_passes_straight_through_the_breaker() -> None:
    """An attempt of a request already admitted by dry-run goes through the (open) breaker
    middleware untouched, as its ``__call__`` does: no shed, the inner app answers."""
    clock = FakeClock()
    calls: list[int] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append(1)
        find_context(scope).record(AttemptOutcome.SUCCESS)  # type: ignore[union-attr]
        await send(HEAD_200)

    breaker = _breaker_mw(inner, clock, BreakerMiddleware)
    mw = _retry(breaker, clock, gate=breaker.admits)
    ctx, scope = _ctx(clock, _scope())
    ctx.would_shed.append(ShedReason.LIMIT)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await mw.stage.attempts(breaker, scope, _receive, send, ctx)
    assert calls == [1] and sent == [HEAD_200]


async def test_a_breaker_middleware_subclass_is_called_as_an_app() -> None:
    """A subclass of BreakerMiddleware (its own ``__call__``) is called, not bypassed."""
    clock = FakeClock()
    called: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        find_context(scope).record(AttemptOutcome.SUCCESS)  # type: ignore[union-attr]
        await send(HEAD_200)

    class Wrapped(BreakerMiddleware):
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            called.append("wrapped")
            await self.app(scope, receive, send)

    breaker = _breaker_mw(inner, clock, Wrapped)
    mw = _retry(breaker, clock)
    _, scope = _ctx(clock, _scope())
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await mw(scope, _receive, send)
    assert called == ["wrapped"] and sent == [HEAD_200]


async def test_a_granted_retry_that_never_runs_is_given_back_to_the_budget() -> None:
    """A swallowed 503 gets a retry from the budget; the breaker shuts during the backoff,
    so no second attempt runs: the retry is refunded, the budget holds none of it."""
    clock = FakeClock()
    gate_answers = [True, False]  # admits at the head, shut after the backoff
    calls = 0

    def gate(ctx: RequestContext, now: float) -> bool:
        return gate_answers.pop(0)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal calls
        calls += 1
        find_context(scope).record(AttemptOutcome.STATUS_5XX)  # type: ignore[union-attr]
        await send(HEAD_503)
        await send({"type": "http.response.body", "body": b"busy", "more_body": False})

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    mw = _retry(app, clock, gate=gate)
    _, scope = _ctx(clock, _scope())
    await mw(scope, _receive, send)
    assert calls == 1 and [m.get("status") for m in sent][:1] == [503]  # the held 503 sent
    snap = mw.stage._budget.snapshot(clock())
    assert snap["retries_granted_total"] == 1 and snap["retries_refunded_total"] == 1
    assert snap["retries_in_window"] == 0


async def test_a_retry_that_runs_stays_spent() -> None:
    """The retry that runs is not refunded: 503 then 200, one retry in the window."""
    clock = FakeClock()
    statuses = [503, 200]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        status = statuses.pop(0)
        outcome = AttemptOutcome.STATUS_5XX if status == 503 else AttemptOutcome.SUCCESS
        find_context(scope).record(outcome)  # type: ignore[union-attr]
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def send(message: Message) -> None:
        return None

    mw = _retry(app, clock)
    _, scope = _ctx(clock, _scope())
    await mw(scope, _receive, send)
    snap = mw.stage._budget.snapshot(clock())
    assert statuses == [] and snap["retries_in_window"] == 1
    assert snap["retries_refunded_total"] == 0
