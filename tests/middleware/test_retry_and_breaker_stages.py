"""RetryMiddleware over BreakerMiddleware against scripted upstream apps (fake clock)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.lowlevel
import httpx
import pytest

from ballast_asgi.config import RetryConfig
from ballast_asgi.core.breaker import Breaker, BreakerState
from ballast_asgi.core.head import HeadLimits, read_head
from ballast_asgi.core.outcome import AttemptOutcome, ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.retry_budget import RetryBudget
from ballast_asgi.core.types import ASGIApp, Message, Receive, Scope, Send
from ballast_asgi.middleware.body import BodyMiddleware
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.context import RequestContext, find_context, with_context
from ballast_asgi.middleware.responses import ShedResponder, send_json
from ballast_asgi.middleware.retry import RetryMiddleware
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.telemetry.metrics import Metrics, null_metrics
from tests.fakes import FakeClock

Behaviour = Callable[[Scope, Receive, Send, "Harness"], Awaitable[None]]
CHUNKED = (b"transfer-encoding", b"chunked")


class Harness:
    """The middleware over a scripted inner app, behind a context-creating shim."""

    def __init__(
        self,
        script: list[Behaviour],
        *,
        config: RetryConfig | None = None,
        breaker: Breaker | None = None,
        budget: RetryBudget | None = None,
        deadline_s: float | None = 5.0,
        with_ctx: bool = True,
        upstream: ASGIApp | None = None,
        clock: FakeClock | None = None,
        replay_max_bytes: int = 1 << 20,
    ) -> None:
        self.clock = clock or FakeClock()
        self.script = script
        self.calls: list[dict[str, Any]] = []
        self.sleeps: list[float] = []
        self.contexts: list[RequestContext] = []
        self.metrics: Metrics = null_metrics()
        self.breaker = breaker or Breaker(
            min_failing_clients=1, consecutive_failures=100, min_calls=1000
        )
        self.budget = budget or RetryBudget(min_retries_per_s=10.0)
        self.deadline_s = deadline_s
        self.with_ctx = with_ctx
        responder = ShedResponder(self.metrics, rng=random.Random(0))
        self.stage = BreakerMiddleware(
            upstream or self.inner,
            breaker=self.breaker,
            responder=responder,
            metrics=self.metrics,
            clock=self.clock,
        )
        self.retry = RetryMiddleware(
            self.stage,
            budget=self.budget,
            metrics=self.metrics,
            config=config or RetryConfig(backoff_base_ms=10, backoff_max_ms=200),
            gate=self.stage.admits,
            clock=self.clock,
            rng=random.Random(1),
            sleep=self.sleep,
        )
        self.middleware = BodyMiddleware(
            self.retry,
            responder=responder,
            metrics=self.metrics,
            replay_max_bytes=replay_max_bytes,
            clock=self.clock,
        )

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.clock.now += seconds

    async def inner(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        message = await receive()
        body += message.get("body", b"")
        while message.get("more_body", False):
            message = await receive()
            body += message.get("body", b"")
        ctx = find_context(scope)
        self.calls.append({"body": body, "attempt": ctx.attempt if ctx else None})
        behaviour = self.script[min(len(self.calls), len(self.script)) - 1]
        await behaviour(scope, receive, send, self)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.with_ctx:
            now = self.clock()
            deadline = None if self.deadline_s is None else now + self.deadline_s
            head = read_head(scope["headers"], HeadLimits())
            ctx = RequestContext(arrival=now, deadline=deadline, priority=Priority.BULK, head=head)
            self.contexts.append(ctx)
            scope = with_context(scope, ctx)
        await self.middleware(scope, receive, send)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://t")

    def retries(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value("ballast_retries_total", {"result": result})
        return value or 0.0


# -- scripted upstream behaviours -------------------------------------------


def ok(status: int = 200, body: bytes = b"ok") -> Behaviour:
    async def run(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return run


_KINDS = {
    "connect": AttemptOutcome.CONNECT_ERROR,
    "timeout": AttemptOutcome.TIMEOUT,
    "deadline": AttemptOutcome.DEADLINE,
    "protocol": AttemptOutcome.PROTOCOL_ERROR,
}


def upstream_error(kind: str, status: int) -> Behaviour:
    """What the proxy does on a connect error (502) or a timeout (504): record, then answer."""

    async def run(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
        ctx = find_context(scope)
        if ctx is not None:
            ctx.record(_KINDS[kind])
        await send_json(send, status, {"error": kind})

    return run


async def reset_mid_body_raise(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
    """A generic app whose connection breaks after the headers: it raises."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"partial", "more_body": True})
    raise ConnectionResetError("upstream reset")


async def reset_before_head(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
    """A reset before any byte of the response: recorded, then raised."""
    ctx = find_context(scope)
    if ctx is not None:
        ctx.record(AttemptOutcome.PROTOCOL_ERROR)
    raise ConnectionResetError("upstream reset before the head")


async def hang_past_deadline(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
    """The upstream hangs; the proxy's timeout (the remaining budget) fires: 504."""
    ctx = find_context(scope)
    assert ctx is not None and ctx.deadline is not None
    h.clock.now = ctx.deadline
    await upstream_error("deadline", 504)(scope, receive, send, h)


def slow_timeout(seconds: float) -> Behaviour:
    """A timeout that used only part of the budget (e.g. connect timeout)."""

    async def run(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
        h.clock.now += seconds
        await upstream_error("timeout", 504)(scope, receive, send, h)

    return run


# -- raw ASGI driver (for ordering and disconnect tests) ----------------------


async def raw_call(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    *,
    method: str = "GET",
    chunks: list[bytes] | None = None,
    disconnect_after_body: bool = False,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> list[Message]:
    incoming: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks or [b""]) - 1}
        for i, c in enumerate(chunks or [b""])
    ]
    if disconnect_after_body:
        incoming.append({"type": "http.disconnect"})
    sent: list[Message] = []
    done = asyncio.Event()

    async def receive() -> Message:
        if incoming:
            return incoming.pop(0)
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": method, "path": "/", "headers": headers or [],
        "query_string": b"",
    }  # fmt: skip
    try:
        await app(scope, receive, send)
    finally:
        done.set()
    return sent


# -- tests --------------------------------------------------------------------


@pytest.mark.anyio
async def test_success_passes_through() -> None:
    """A healthy upstream answer reaches the client unchanged, with no retry."""
    h = Harness([ok(200, b"hello")])
    async with h.client() as client:
        r = await client.get("/")
    assert (r.status_code, r.content) == (200, b"hello")
    assert len(h.calls) == 1 and h.retries("attempted") == 0
    assert h.contexts[0].outcome is AttemptOutcome.SUCCESS


@pytest.mark.anyio
async def test_non_http_scopes_pass_straight_through() -> None:
    """Lifespan messages go to the inner app untouched."""
    seen: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    h = Harness([ok()])
    h.middleware.app = inner
    await h.middleware({"type": "lifespan"}, raw_receive_never, raw_send_never)
    assert seen == ["lifespan"]


async def raw_receive_never() -> Message:
    raise AssertionError("not called")


async def raw_send_never(message: Message) -> None:
    raise AssertionError("not called")


@pytest.mark.anyio
async def test_connection_refused_is_retried() -> None:
    """A connect error (502 from the proxy) is replaced by a successful retry."""
    h = Harness([upstream_error("connect", 502), ok(200, b"second")])
    async with h.client() as client:
        r = await client.get("/")
    assert (r.status_code, r.content) == (200, b"second")
    assert [c["attempt"] for c in h.calls] == [0, 1]
    assert h.retries("attempted") == 1 and h.retries("succeeded") == 1
    ctx = h.contexts[0]
    assert ctx.attempt == 1 and ctx.outcome is AttemptOutcome.SUCCESS
    assert len(h.sleeps) == 1 and 0 <= h.sleeps[0] <= 0.010


@pytest.mark.anyio
async def test_503_retried_up_to_max_attempts_then_returned() -> None:
    """A persistent 503 is tried max_attempts times and then returned as is, marked dropped."""
    h = Harness([ok(503, b"busy")])
    async with h.client() as client:
        r = await client.get("/")
    assert (r.status_code, r.content) == (503, b"busy")
    assert len(h.calls) == 3
    assert h.retries("attempted") == 2 and h.retries("succeeded") == 0
    assert h.contexts[0].outcome is AttemptOutcome.STATUS_5XX
    assert all(s <= c for s, c in zip(h.sleeps, (0.010, 0.020), strict=True))


@pytest.mark.anyio
async def test_4xx_is_kept_and_is_a_breaker_success() -> None:
    """A 404 is the answer, not a failure: no retry, and the breaker stays closed."""
    h = Harness([ok(404, b"nope")], breaker=Breaker(min_failing_clients=1, consecutive_failures=1))
    async with h.client() as client:
        r = await client.get("/")
    assert r.status_code == 404 and len(h.calls) == 1
    assert h.breaker.state(h.clock()) is BreakerState.CLOSED


@pytest.mark.anyio
async def test_500_counts_as_failure_but_is_not_retried_by_default() -> None:
    """500 is a breaker failure; only 502/503/504 are retried by default."""
    h = Harness([ok(500, b"bug")], breaker=Breaker(min_failing_clients=1, consecutive_failures=1))
    async with h.client() as client:
        r = await client.get("/")
    assert r.status_code == 500 and len(h.calls) == 1
    assert h.breaker.state(h.clock()) is BreakerState.OPEN


@pytest.mark.anyio
async def test_post_is_not_retried_without_idempotency_key() -> None:
    """A non-idempotent method gets one attempt."""
    h = Harness([ok(503), ok(200)])
    async with h.client() as client:
        r = await client.post("/", content=b"payload")
    assert r.status_code == 503 and len(h.calls) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["timeout", "protocol"])
async def test_post_is_not_retried_after_the_request_may_have_been_sent(kind: str) -> None:
    """A timeout or a reset may come after the upstream saw the POST: one attempt only."""
    h = Harness([upstream_error(kind, 504 if kind == "timeout" else 502), ok(201)])
    async with h.client() as client:
        r = await client.post("/", content=b"payload")
    assert r.status_code in (502, 504) and len(h.calls) == 1


@pytest.mark.anyio
async def test_post_is_retried_after_a_connect_error_with_the_same_body() -> None:
    """No connection was made, so the upstream saw nothing: any method may go again."""
    h = Harness([upstream_error("connect", 502), ok(201)])
    async with h.client() as client:
        r = await client.post("/", content=b"payload")
    assert r.status_code == 201
    assert [c["body"] for c in h.calls] == [b"payload", b"payload"]


@pytest.mark.anyio
async def test_post_with_idempotency_key_is_retried_with_the_same_body() -> None:
    """An Idempotency-Key makes POST retryable, and the body is replayed byte for byte."""
    h = Harness([upstream_error("connect", 502), ok(201)])
    async with h.client() as client:
        r = await client.post("/", content=b"payload", headers={"Idempotency-Key": "k1"})
    assert r.status_code == 201
    assert [c["body"] for c in h.calls] == [b"payload", b"payload"]


@pytest.mark.anyio
async def test_a_failure_after_a_success_head_propagates_and_is_not_retried() -> None:
    """Once a 2xx head is passed on the body streams: a reset mid-body aborts, never retries."""
    h = Harness([reset_mid_body_raise, ok(200, b"whole")])
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    with pytest.raises(ConnectionResetError):
        await h.app({"type": "http", "method": "GET", "path": "/", "headers": []}, receive, send)
    assert len(h.calls) == 1
    assert [m.get("body") for m in sent[1:]] == [b"partial"]


@pytest.mark.anyio
async def test_the_head_streams_before_the_body_is_complete() -> None:
    """A success head reaches the client before the inner app sends its body (no buffering)."""
    seen_at_body: list[int] = []
    sent: list[Message] = []

    async def inner(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        seen_at_body.append(len(sent))
        await send({"type": "http.response.body", "body": b"x"})

    h = Harness([inner])

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await h.app({"type": "http", "method": "GET", "path": "/", "headers": []}, receive, send)
    assert seen_at_body == [1]


@pytest.mark.anyio
async def test_reset_before_the_head_is_retried() -> None:
    """A reset before any response byte (recorded PROTOCOL_ERROR, raised) is retried."""
    h = Harness([reset_before_head, ok(200, b"whole")])
    async with h.client() as client:
        r = await client.get("/")
    assert (r.status_code, r.content) == (200, b"whole")
    assert h.retries("succeeded") == 1


@pytest.mark.anyio
async def test_final_exception_is_reraised_not_swallowed() -> None:
    """When no retry is left, the inner app's exception propagates."""
    h = Harness([reset_before_head], config=RetryConfig(max_attempts=2, backoff_base_ms=0))
    with pytest.raises(ConnectionResetError):
        await raw_call(h.app)
    assert len(h.calls) == 2
    assert h.contexts[0].outcome is AttemptOutcome.PROTOCOL_ERROR


@pytest.mark.anyio
async def test_the_gateways_own_exception_is_neither_retried_nor_a_breaker_failure() -> None:
    """An inner app raising with nothing recorded (a gateway bug) counts as nothing."""

    async def bug(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
        raise ValueError("cannot build the upstream URL")

    h = Harness([bug], breaker=Breaker(min_failing_clients=1, consecutive_failures=1))
    for _ in range(5):
        with pytest.raises(ValueError):
            await raw_call(h.app)
    assert len(h.calls) == 5
    assert h.breaker.state(h.clock()) is BreakerState.CLOSED
    assert h.breaker.snapshot(h.clock())["window_calls"] == 0


@pytest.mark.anyio
async def test_hang_past_deadline_gets_504_and_no_retry() -> None:
    """A timeout that used the whole budget is returned at once: no time left to retry."""
    h = Harness([hang_past_deadline, ok()], deadline_s=1.0)
    async with h.client() as client:
        r = await client.get("/")
    assert r.status_code == 504 and len(h.calls) == 1 and h.sleeps == []
    assert h.clock() <= h.contexts[0].deadline  # type: ignore[operator]


@pytest.mark.anyio
async def test_deadline_timeouts_never_trip_the_breaker() -> None:
    """Requests whose own budget ran out are not upstream failures: the breaker stays closed."""
    sensitive = Breaker(min_failing_clients=1, consecutive_failures=3, min_calls=5)
    h = Harness([hang_past_deadline] * 30, deadline_s=1.0, breaker=sensitive)
    async with h.client() as client:
        for _ in range(30):
            assert (await client.get("/")).status_code == 504
    assert h.breaker.state(h.clock()) == "closed"
    assert all(c.outcome is AttemptOutcome.DEADLINE for c in h.contexts)


@pytest.mark.anyio
async def test_backoff_is_bounded_by_the_deadline() -> None:
    """With little budget left, the backoff shrinks to fit before the deadline."""
    config = RetryConfig(backoff_base_ms=10_000, backoff_max_ms=10_000)
    h = Harness([slow_timeout(0.9), ok()], config=config, deadline_s=1.0)
    async with h.client() as client:
        r = await client.get("/")
    assert r.status_code == 200
    assert len(h.sleeps) == 1 and h.sleeps[0] <= 0.1 - 0.020 + 1e-9


@pytest.mark.anyio
async def test_budget_exhausted_returns_the_failure_as_is() -> None:
    """With an empty budget the failure is returned and counted as denied."""
    budget = RetryBudget(budget_ratio=0.0, min_retries_per_s=0.0)
    h = Harness([ok(503, b"busy"), ok()], budget=budget)
    async with h.client() as client:
        r = await client.get("/")
    assert (r.status_code, r.content) == (503, b"busy")
    assert len(h.calls) == 1
    assert h.retries("denied") == 1 and h.retries("attempted") == 0


@pytest.mark.anyio
async def test_open_breaker_sheds_without_calling_upstream() -> None:
    """While open: 503, X-Ballast-Reason breaker_open, Retry-After = remaining open time."""
    breaker = Breaker(
        min_failing_clients=1, consecutive_failures=1, open_ms=7_000, max_open_ms=60_000
    )
    h = Harness([ok(503)], breaker=breaker, budget=RetryBudget(budget_ratio=0, min_retries_per_s=0))
    async with h.client() as client:
        first = await client.get("/")
        h.clock.now += 2.2
        r = await client.get("/")
    assert first.status_code == 503 and len(h.calls) == 1
    assert r.status_code == 503
    assert r.headers["x-ballast-reason"] == "breaker_open"
    assert r.headers["retry-after"] == "5"
    assert json.loads(r.content)["priority"] == "bulk"
    assert h.contexts[1].shed_reason is ShedReason.BREAKER_OPEN
    assert h.contexts[1].outcome is None  # no upstream attempt


@pytest.mark.anyio
async def test_a_failure_that_trips_the_breaker_is_not_retried() -> None:
    """No retry once the breaker is open, even with budget left."""
    h = Harness([ok(503), ok()], breaker=Breaker(min_failing_clients=1, consecutive_failures=1))
    async with h.client() as client:
        r = await client.get("/")
    assert r.status_code == 503 and len(h.calls) == 1


@pytest.mark.anyio
async def test_half_open_lets_exactly_one_probe_through_concurrently() -> None:
    """Many concurrent requests in half-open: one reaches the upstream, the rest are shed."""
    release = asyncio.Event()

    async def held(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
        await release.wait()
        await ok(200)(scope, receive, send, h)

    breaker = Breaker(min_failing_clients=1, consecutive_failures=1, open_ms=1_000)
    h = Harness([held], breaker=breaker)
    ticket = breaker.acquire(h.clock())
    assert ticket is not None
    ticket.record(False, h.clock())
    h.clock.now += 1.0
    async with h.client() as client:
        tasks = [asyncio.ensure_future(client.get("/")) for _ in range(50)]
        for _ in range(10_000):  # yield to the loop (no waiting) until all are decided
            if h.calls and sum(t.done() for t in tasks) == 49:
                break
            await anyio.lowlevel.checkpoint()
        release.set()
        responses = await asyncio.gather(*tasks)
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] + [503] * 49
    assert len(h.calls) == 1
    assert breaker.state(h.clock()) is BreakerState.CLOSED


@pytest.mark.anyio
async def test_failed_probe_is_not_retried() -> None:
    """A failing half-open probe reopens the breaker, so its retry is refused."""
    breaker = Breaker(min_failing_clients=1, consecutive_failures=1, open_ms=1_000)
    h = Harness([upstream_error("connect", 502), ok()], breaker=breaker)
    ticket = breaker.acquire(h.clock())
    assert ticket is not None
    ticket.record(False, h.clock())
    h.clock.now += 1.0
    async with h.client() as client:
        r = await client.get("/")
    assert r.status_code == 502 and len(h.calls) == 1
    assert breaker.state(h.clock()) is BreakerState.OPEN


@pytest.mark.anyio
async def test_streaming_mode_passes_through_without_retries() -> None:
    """buffer_responses=false: one attempt, the failure passes through, the breaker records it."""
    h = Harness([ok(503), ok()], config=RetryConfig(buffer_responses=False))
    messages = await raw_call(h.app)
    assert len(h.calls) == 1 and h.retries("attempted") == 0
    assert [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    assert messages[0]["status"] == 503
    assert h.breaker.snapshot(h.clock())["window_failures"] == 1
    assert h.contexts[0].outcome is AttemptOutcome.STATUS_5XX


@pytest.mark.anyio
async def test_streaming_mode_forwards_each_message_immediately() -> None:
    """In streaming mode each message is forwarded as it is sent, not held."""
    seen_at_start: list[int] = []
    sent: list[Message] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        seen_at_start.append(len(sent))
        await send({"type": "http.response.body", "body": b"x"})

    h = Harness([ok()], config=RetryConfig(buffer_responses=False))
    h.middleware.app = inner

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    await h.middleware(scope, receive, send)
    assert seen_at_start == [1]


@pytest.mark.anyio
async def test_large_response_commits_and_is_not_retried() -> None:
    """Past max_buffer_bytes the response streams; a failure after that is not retried."""

    async def big_then_reset(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x" * 100, "more_body": True})
        raise ConnectionResetError("after commit")

    h = Harness([big_then_reset, ok()], config=RetryConfig(max_buffer_bytes=50))
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    with pytest.raises(ConnectionResetError):
        await h.app({"type": "http", "method": "GET", "path": "/", "headers": []}, receive, send)
    assert len(h.calls) == 1
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


@pytest.mark.anyio
async def test_large_request_body_gets_one_streamed_attempt() -> None:
    """A request body over max_buffer_bytes is forwarded whole but cannot be replayed."""
    h = Harness([ok(503)], replay_max_bytes=10)
    messages = await raw_call(
        h.app, method="PUT", chunks=[b"a" * 8, b"b" * 8, b"c" * 8], headers=[CHUNKED]
    )
    assert h.calls[0]["body"] == b"a" * 8 + b"b" * 8 + b"c" * 8
    assert len(h.calls) == 1
    assert messages[0]["status"] == 503


@pytest.mark.anyio
async def test_client_gone_while_reading_body_makes_no_call() -> None:
    """A client that leaves during the request body costs no upstream attempt."""
    h = Harness([ok()])
    incoming: list[Message] = [
        {"type": "http.request", "body": b"part", "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return incoming.pop(0)

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "PUT", "path": "/", "headers": [CHUNKED]}
    await h.app(scope, receive, send)
    assert h.calls == [] and sent == []
    assert h.contexts[0].outcome is None
    assert h.breaker.snapshot(h.clock())["window_calls"] == 0


@pytest.mark.anyio
async def test_client_gone_during_attempt_stops_retries() -> None:
    """When the client disconnects during an attempt, the failure is not retried."""

    async def sees_disconnect(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
        message = await receive()
        assert message["type"] == "http.disconnect"
        ctx = find_context(scope)
        assert ctx is not None
        ctx.record(AttemptOutcome.CLIENT_GONE)  # what the proxy does: no response

    h = Harness([sees_disconnect, ok()])
    await raw_call(h.app, disconnect_after_body=True)
    assert len(h.calls) == 1
    assert h.contexts[0].outcome is AttemptOutcome.CLIENT_GONE


@pytest.mark.anyio
async def test_cancellation_frees_the_probe_and_propagates() -> None:
    """A cancelled probe request releases the probe slot and re-raises CancelledError."""
    started = asyncio.Event()

    async def forever(scope: Scope, receive: Receive, send: Send, h: Harness) -> None:
        started.set()
        await asyncio.Event().wait()

    breaker = Breaker(min_failing_clients=1, consecutive_failures=1, open_ms=1_000)
    h = Harness([forever], breaker=breaker)
    t = breaker.acquire(h.clock())
    assert t is not None
    t.record(False, h.clock())
    h.clock.now += 1.0
    task = asyncio.ensure_future(raw_call(h.app))
    await started.wait()
    assert not breaker.can_acquire(h.clock())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breaker.can_acquire(h.clock())


@pytest.mark.anyio
async def test_works_without_admission_context() -> None:
    """Standalone (no RequestContext): one attempt each, 5xx counted, shed as standard."""
    breaker = Breaker(min_failing_clients=1, consecutive_failures=2, open_ms=3_000)
    h = Harness([ok(503), ok(503), ok()], breaker=breaker, with_ctx=False)
    async with h.client() as client:
        assert (await client.get("/")).status_code == 503
        r = await client.get("/")
        shed = await client.get("/")
    assert r.status_code == 503 and len(h.calls) == 2
    assert shed.status_code == 503
    assert json.loads(shed.content)["priority"] == "standard"


@pytest.mark.anyio
async def test_retry_disabled_means_one_attempt() -> None:
    """retry.enabled=false: a failure is returned at once."""
    h = Harness([ok(503), ok()], config=RetryConfig(enabled=False))
    async with h.client() as client:
        r = await client.get("/")
    assert r.status_code == 503 and len(h.calls) == 1


@pytest.mark.anyio
async def test_metrics_show_state_transitions_and_budget() -> None:
    """Breaker state, transitions and budget balance are in the exposition."""
    breaker = Breaker(min_failing_clients=1, consecutive_failures=1)
    h = Harness([ok(503)], breaker=breaker, budget=RetryBudget(min_retries_per_s=0.5))
    async with h.client() as client:
        await client.get("/")
    text = h.metrics.exposition().decode()
    assert 'ballast_breaker_state{state="open"} 1.0' in text
    assert 'ballast_breaker_transitions_total{to="open"} 1.0' in text
    assert "ballast_retry_budget_balance 5.1" in text


# -- with the real ProxyApp over httpx.MockTransport ---------------------------


@asynccontextmanager
async def _proxied(
    handler: Callable[[httpx.Request], httpx.Response], **kw: Any
) -> AsyncIterator[tuple[Harness, httpx.AsyncClient]]:
    """A harness whose upstream is ProxyApp over MockTransport(handler), and a client."""
    clock = FakeClock()
    proxy = ProxyApp("http://u.test", transport=httpx.MockTransport(handler), clock=clock)
    h = Harness([], upstream=proxy, clock=clock, **kw)
    try:
        async with h.client() as client:
            yield h, client
    finally:
        await proxy.aclose()


@pytest.mark.anyio
async def test_proxy_connect_error_is_retried() -> None:
    """ProxyApp's connect error (httpx.ConnectError -> 502) is replaced by the retry's 200."""
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, content=b"from upstream")

    async with _proxied(handler) as (h, client):
        r = await client.get("/x")
    assert (r.status_code, r.content) == (200, b"from upstream")
    assert len(calls) == 2 and h.retries("succeeded") == 1


@pytest.mark.anyio
async def test_proxy_refusing_every_call_trips_the_breaker() -> None:
    """An upstream that refuses every connection: 502s, then the breaker opens and sheds."""
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("connection refused")

    async with _proxied(handler, breaker=Breaker(consecutive_failures=5)) as (h, client):
        statuses = [(await client.get("/")).status_code for _ in range(5)]
    assert statuses[:2] == [502, 502] and statuses[-1] == 503
    assert len(calls) == 5
    assert h.breaker.state(h.clock()) is BreakerState.OPEN
