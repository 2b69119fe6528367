"""BallastTransport over httpx.MockTransport: propagation, refusals, sheds, retries, budget."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ballast_asgi.client import (
    BallastTransport,
    ClientConfig,
    DeadlineExceeded,
    LocalRefusal,
    Throttled,
)
from ballast_asgi.core.priority import Priority
from ballast_asgi.middleware.context import RequestContext

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], httpx.Response]


class FakeClock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Recorder:
    """A MockTransport handler that records each request and answers from a script."""

    def __init__(self, clock: FakeClock, *answers: int | Exception, took_s: float = 0.0) -> None:
        self.clock = clock
        self.answers = list(answers)
        self.took_s = took_s
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        self.clock.t += self.took_s
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer)


def _transport(
    clock: FakeClock,
    handler: Handler,
    ctx: RequestContext | None = None,
    config: ClientConfig | None = None,
    sleeps: list[float] | None = None,
    registry: CollectorRegistry | None = None,
) -> BallastTransport:
    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)
        clock.t += seconds

    return BallastTransport(
        httpx.MockTransport(handler),
        config=config,
        clock=clock,
        rng=random.Random(1),
        sleep=sleep,
        context=lambda: ctx,
        registry=registry,
    )


def _ctx(clock: FakeClock, budget_s: float | None, priority: Priority) -> RequestContext:
    deadline = None if budget_s is None else clock.t + budget_s
    return RequestContext(arrival=clock.t, deadline=deadline, priority=priority, clock=clock)


async def test_forwards_remaining_budget_and_tier() -> None:
    """In an admitted request: X-Deadline-Ms = budget minus time spent; X-Priority = its tier."""
    clock = FakeClock()
    rec = Recorder(clock, 200)
    ctx = _ctx(clock, 1.0, Priority.CRITICAL)
    clock.t += 0.3  # the handler already spent 300 ms
    async with httpx.AsyncClient(transport=_transport(clock, rec, ctx)) as client:
        response = await client.get("http://b.test/x")
    assert response.status_code == 200
    sent = rec.seen[0]
    assert sent.headers["x-deadline-ms"] == "700"
    assert sent.headers["x-priority"] == "critical"
    assert max(sent.extensions["timeout"].values()) == pytest.approx(0.7)


async def test_caller_headers_win() -> None:
    """A caller's own X-Deadline-Ms and X-Priority are forwarded unchanged."""
    clock = FakeClock()
    rec = Recorder(clock, 200)
    ctx = _ctx(clock, 1.0, Priority.CRITICAL)
    headers = {"X-Deadline-Ms": "250", "X-Priority": "bulk"}
    async with httpx.AsyncClient(transport=_transport(clock, rec, ctx)) as client:
        await client.get("http://b.test/x", headers=headers)
    assert rec.seen[0].headers["x-deadline-ms"] == "250"
    assert rec.seen[0].headers["x-priority"] == "bulk"
    assert max(rec.seen[0].extensions["timeout"].values()) == pytest.approx(0.25)


async def test_caller_timeout_is_cut_to_the_budget_not_raised() -> None:
    """The call's httpx timeouts become min(caller's, remaining budget)."""
    clock = FakeClock()
    rec = Recorder(clock, 200)
    ctx = _ctx(clock, 2.0, Priority.STANDARD)
    async with httpx.AsyncClient(transport=_transport(clock, rec, ctx)) as client:
        await client.get("http://b.test/x", timeout=httpx.Timeout(5.0, connect=0.5))
    assert rec.seen[0].extensions["timeout"] == {
        "connect": 0.5, "read": 2.0, "write": 2.0, "pool": 2.0,
    }  # fmt: skip


async def test_outside_a_request_nothing_is_added() -> None:
    """With no admitted request and no defaults, no header is added and no budget applies."""
    clock = FakeClock()
    rec = Recorder(clock, 200)
    async with httpx.AsyncClient(transport=_transport(clock, rec)) as client:
        await client.get("http://b.test/x")
    assert "x-deadline-ms" not in rec.seen[0].headers
    assert "x-priority" not in rec.seen[0].headers


async def test_outside_a_request_defaults_apply() -> None:
    """Configured defaults give calls outside a request a deadline and a tier."""
    clock = FakeClock()
    rec = Recorder(clock, 200)
    cfg = ClientConfig(default_deadline_ms=1500, default_priority=Priority.BULK)
    async with httpx.AsyncClient(transport=_transport(clock, rec, config=cfg)) as client:
        await client.get("http://b.test/x")
    assert rec.seen[0].headers["x-deadline-ms"] == "1500"
    assert rec.seen[0].headers["x-priority"] == "bulk"


@pytest.mark.parametrize("budget_s", [-0.5, 0.0, 0.004])
async def test_no_budget_call_is_never_sent(budget_s: float) -> None:
    """A call with less budget than the floor raises DeadlineExceeded and sends nothing."""
    clock = FakeClock()
    rec = Recorder(clock, 200)
    transport = _transport(clock, rec, _ctx(clock, budget_s, Priority.STANDARD))
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(DeadlineExceeded) as info:
            await client.get("http://b.test/x")
    assert rec.seen == []
    assert info.value.sent is False
    assert isinstance(info.value, httpx.TimeoutException | LocalRefusal)
    assert transport.totals().no_budget == 1


async def test_budget_below_recent_latency_is_not_sent() -> None:
    """Once a host answers in 100 ms, a call with 50 ms left is refused locally."""
    clock = FakeClock()
    rec = Recorder(clock, 200, took_s=0.1)
    ctx = _ctx(clock, 10.0, Priority.STANDARD)
    transport = _transport(clock, rec, ctx)
    async with httpx.AsyncClient(transport=transport) as client:
        await client.get("http://b.test/x")
        ctx.deadline = clock.t + 0.05
        with pytest.raises(DeadlineExceeded, match=r"recent latency 100\.0 ms"):
            await client.get("http://b.test/x")
    assert len(rec.seen) == 1


async def test_ballast_shed_is_not_retried_and_retry_after_is_honoured() -> None:
    """A 503 with X-Ballast-Reason is returned as is; the tier backs off for Retry-After."""
    clock = FakeClock()

    def shed(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) > 1:
            return httpx.Response(200)
        return httpx.Response(503, headers={"X-Ballast-Reason": "queue_full", "Retry-After": "2"})

    seen: list[httpx.Request] = []
    ctx = _ctx(clock, 60.0, Priority.STANDARD)
    transport = _transport(clock, shed, ctx)
    async with httpx.AsyncClient(transport=transport) as client:
        first = await client.get("http://b.test/x")
        assert first.status_code == 503 and len(seen) == 1
        clock.t += 1.0
        with pytest.raises(Throttled) as info:
            await client.get("http://b.test/x")
        assert info.value.reason == "retry_after" and info.value.retry_after_s == pytest.approx(1)
        ctx.priority = Priority.CRITICAL  # a more important tier is not blocked
        await client.get("http://b.test/x")
        ctx.priority = Priority.STANDARD
        clock.t += 1.01
        await client.get("http://b.test/x")
    assert len(seen) == 3
    assert transport.totals().retried == 0


async def test_plain_429_is_not_retried() -> None:
    """A 429 (no ballast reason) is a refusal too: returned, never retried."""
    clock = FakeClock()
    rec = Recorder(clock, 429)
    async with httpx.AsyncClient(transport=_transport(clock, rec)) as client:
        assert (await client.get("http://b.test/x")).status_code == 429
    assert len(rec.seen) == 1


@pytest.mark.parametrize("failure", [502, 503, 504, httpx.ConnectError("refused")])
async def test_idempotent_call_is_retried_after_a_retryable_failure(
    failure: int | Exception,
) -> None:
    """A GET after a 502/503/504 without reason or a connect error is retried once and succeeds."""
    clock = FakeClock()
    rec = Recorder(clock, failure, 200)
    sleeps: list[float] = []
    transport = _transport(clock, rec, _ctx(clock, 5.0, Priority.STANDARD), sleeps=sleeps)
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get("http://b.test/x")).status_code == 200
    assert len(rec.seen) == 2
    assert len(sleeps) == 1 and 0.0 <= sleeps[0] <= 0.025
    assert int(rec.seen[1].headers["x-deadline-ms"]) < 5000


async def test_post_is_not_retried() -> None:
    """A non-idempotent call gets its 502 back after one attempt."""
    clock = FakeClock()
    rec = Recorder(clock, 502, 200)
    async with httpx.AsyncClient(transport=_transport(clock, rec)) as client:
        assert (await client.post("http://b.test/x", content=b"x")).status_code == 502
    assert len(rec.seen) == 1


async def test_streamed_body_is_not_retried() -> None:
    """A body that cannot be replayed (a generator) is sent once."""
    clock = FakeClock()
    rec = Recorder(clock, 503, 200)

    async def body() -> object:
        yield b"chunk"

    async with httpx.AsyncClient(transport=_transport(clock, rec)) as client:
        response = await client.put("http://b.test/x", content=body())  # type: ignore[arg-type]
    assert response.status_code == 503 and len(rec.seen) == 1


async def test_connect_error_is_raised_when_no_retry_is_left() -> None:
    """With every attempt refused to connect, the last ConnectError propagates."""
    clock = FakeClock()
    rec = Recorder(clock, httpx.ConnectError("refused"))
    async with httpx.AsyncClient(transport=_transport(clock, rec)) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://b.test/x")
    assert len(rec.seen) == 2  # a fresh budget holds 0.1 * 1 + 1 (floor): one retry


async def test_retries_stay_inside_the_deadline() -> None:
    """No retry starts when its backoff plus the floor would pass the deadline."""
    clock = FakeClock()
    rec = Recorder(clock, 503, took_s=0.02)
    cfg = ClientConfig(backoff_base_ms=40, min_retries_per_s=100.0, max_attempts=10)
    ctx = _ctx(clock, 0.1, Priority.STANDARD)
    deadline = ctx.deadline
    assert deadline is not None
    transport = _transport(clock, rec, ctx, config=cfg)
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get("http://b.test/x")).status_code == 503
    budgets = [int(r.headers["x-deadline-ms"]) for r in rec.seen]
    assert len(budgets) >= 2
    assert budgets == sorted(budgets, reverse=True) and min(budgets) >= 5
    assert clock.t <= deadline


async def test_failing_downstream_gets_at_most_originals_plus_budget() -> None:
    """Downstream failing every call: attempts <= originals + ratio * originals + floor."""
    clock = FakeClock()
    rec = Recorder(clock, 503, took_s=0.001)
    transport = _transport(clock, rec, _ctx(clock, 1e6, Priority.STANDARD))
    originals = 300
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(originals):
            clock.t += 0.01
            with contextlib.suppress(Throttled):
                await client.get("http://b.test/x")
    # 300 originals over about 3 s (one 10 s budget window): 0.1 * 300 + 1 retries at most
    assert len(rec.seen) <= originals + 0.1 * originals + 1
    totals = transport.totals()
    assert totals.retried <= 31 and totals.throttled > 0
    assert totals.sent == len(rec.seen)


async def test_throttle_refuses_locally_when_the_host_rejects() -> None:
    """After many 503s the adaptive throttle refuses calls without sending them."""
    clock = FakeClock()
    rec = Recorder(clock, 503)
    transport = _transport(clock, rec, config=ClientConfig(max_attempts=1))
    refused = 0
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(200):
            try:
                await client.get("http://b.test/x")
            except Throttled as exc:
                assert exc.reason == "throttled"
                refused += 1
    assert refused > 100 and len(rec.seen) == 200 - refused


async def test_snapshot_and_metrics() -> None:
    """The transport's snapshot and collector report per-host calls, retries and budget."""
    clock = FakeClock()
    rec = Recorder(clock, 502, 200)
    registry = CollectorRegistry()
    transport = _transport(clock, rec, registry=registry)
    async with httpx.AsyncClient(transport=transport) as client:
        await client.get("http://b.test/x")
    doc = transport.snapshot()
    assert doc["retried"] == 1 and doc["sent"] == 2
    host = doc["hosts"]["http://b.test:80"]
    assert host["retry_budget"]["balance"] == pytest.approx(0.1)
    assert host["throttle"]["requests_in_window"] == 2
    text = generate_latest(registry).decode()
    assert 'ballast_client_calls_total{event="retried",host="http://b.test:80"} 1.0' in text
    assert "ballast_client_retry_budget_balance" in text


async def test_budget_running_out_in_flight_raises_deadline_exceeded() -> None:
    """A call still unanswered when its budget ends raises DeadlineExceeded(sent=True)."""
    clock = FakeClock()
    started = anyio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    transport = _transport(clock, hang, _ctx(clock, 0.02, Priority.STANDARD))
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(DeadlineExceeded) as info:
            await client.get("http://b.test/x")
    assert started.is_set() and info.value.sent is True


async def test_context_of_an_installed_app_reaches_the_call_and_does_not_leak() -> None:
    """In a handler of an install()-ed app the call carries that request's tier and budget;
    after the request, the caller's task sees no context."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from ballast_asgi import install
    from ballast_asgi.middleware.context import current_context

    seen: list[httpx.Request] = []

    def downstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    outbound = httpx.AsyncClient(transport=BallastTransport(httpx.MockTransport(downstream)))

    async def handler(request: Request) -> PlainTextResponse:
        response = await outbound.get("http://chain-a.test/x")
        return PlainTextResponse(str(response.status_code))

    app = Starlette(routes=[Route("/", handler)])
    handle = install(app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://a") as c:
        answer = await c.get("/", headers={"X-Priority": "bulk", "X-Deadline-Ms": "5000"})
        assert answer.text == "200"
        assert current_context() is None
        assert seen[0].headers["x-priority"] == "bulk"
        assert 0 < int(seen[0].headers["x-deadline-ms"]) <= 5000
        snapshot = (await c.get("/_ballast/snapshot")).json()
    await outbound.aclose()
    host = snapshot["client"]["hosts"]["http://chain-a.test:80"]
    assert host["throttle"]["accepts_in_window"] == 1
    assert handle.snapshot()["client"]["transports"] >= 1


async def test_no_budget_marks_the_admitted_request_as_a_deadline_miss() -> None:
    """A refusal for lack of the request's own budget records DEADLINE on its context."""
    from ballast_asgi.core.outcome import AttemptOutcome

    clock = FakeClock()
    ctx = _ctx(clock, 0.001, Priority.STANDARD)
    transport = _transport(clock, Recorder(clock, 200), ctx)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(DeadlineExceeded):
            await client.get("http://b.test/x")
    assert ctx.outcome is AttemptOutcome.DEADLINE
    ctx.record_status(500)
    assert ctx.outcome is AttemptOutcome.DEADLINE  # the handler's 5xx answer does not override


async def test_caller_deadline_refusal_leaves_the_request_outcome_alone() -> None:
    """A refusal on a budget the caller set explicitly records nothing on the request."""
    clock = FakeClock()
    ctx = _ctx(clock, 10.0, Priority.STANDARD)
    transport = _transport(clock, Recorder(clock, 200), ctx)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(DeadlineExceeded):
            await client.get("http://b.test/x", headers={"X-Deadline-Ms": "1"})
    assert ctx.outcome is None


async def test_failed_answer_after_the_budget_is_spent_is_a_deadline_miss() -> None:
    """A 504 arriving when the request's budget is spent records DEADLINE, a 200 does not."""
    from ballast_asgi.core.outcome import AttemptOutcome

    clock = FakeClock()
    late = _ctx(clock, 0.1, Priority.STANDARD)
    async with httpx.AsyncClient(
        transport=_transport(clock, Recorder(clock, 504, took_s=0.1), late)
    ) as client:
        assert (await client.get("http://b.test/x")).status_code == 504
    assert late.outcome is AttemptOutcome.DEADLINE
    fine = _ctx(clock, 0.1, Priority.STANDARD)
    async with httpx.AsyncClient(
        transport=_transport(clock, Recorder(clock, 200, took_s=0.1), fine)
    ) as client:
        assert (await client.get("http://b.test/x")).status_code == 200
    assert fine.outcome is None


async def test_refusal_handler_answers_a_shed() -> None:
    """A refused call let through a handler becomes a 429 shed with reason and Retry-After."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from ballast_asgi.client import refusal_handler

    clock = FakeClock()
    ctx = _ctx(clock, 0.0, Priority.STANDARD)
    outbound = httpx.AsyncClient(transport=_transport(clock, Recorder(clock, 200), ctx))

    async def handler(request: Request) -> Response:
        await outbound.get("http://refused.test/x")
        raise AssertionError("unreachable")

    app = Starlette(routes=[Route("/", handler)])
    app.add_exception_handler(LocalRefusal, refusal_handler)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://a") as c:
        answer = await c.get("/")
    assert answer.status_code == 429
    assert answer.headers["x-ballast-reason"] == "deadline"
    assert answer.headers["retry-after"] == "1"
    exc = Throttled("t", request=httpx.Request("GET", "http://h"), host="h", reason="retry_after",
                    retry_after_s=2.2)  # fmt: skip
    from ballast_asgi.client import refusal_response

    shed = refusal_response(exc)
    assert shed.headers["x-ballast-reason"] == "early_drop" and shed.headers["retry-after"] == "3"


@pytest.mark.parametrize(
    ("raw", "tier", "forwarded"),
    [(b"0", Priority.CRITICAL, "0"), (b" Bulk ", Priority.BULK, "Bulk"),
     (b"bulk", Priority.CRITICAL, "critical"), (None, Priority.STANDARD, "standard")],
)  # fmt: skip
async def test_tier_is_forwarded_as_the_caller_spelt_it(
    raw: bytes | None, tier: Priority, forwarded: str
) -> None:
    """The incoming X-Priority spelling is kept when it named the tier ballast chose."""
    from ballast_asgi.core.head import RequestHead

    clock = FakeClock()
    rec = Recorder(clock, 200)
    ctx = RequestContext(arrival=clock.t, deadline=None, priority=tier,
                         head=RequestHead(priority=raw), clock=clock)  # fmt: skip
    async with httpx.AsyncClient(transport=_transport(clock, rec, ctx)) as client:
        await client.get("http://b.test/x")
    assert rec.seen[0].headers["x-priority"] == forwarded


@pytest.mark.parametrize("value", [b"abc", b"1e300", b"nan", b"-", b"\xe9", b"\xc3\xa9"])
async def test_malformed_caller_deadline_is_forwarded_and_the_request_budget_applies(
    value: bytes,
) -> None:
    """A caller's unreadable X-Deadline-Ms goes out as written; the admitted budget bounds it."""
    clock = FakeClock()
    rec = Recorder(clock, 200)
    ctx = _ctx(clock, 0.5, Priority.STANDARD)
    async with httpx.AsyncClient(transport=_transport(clock, rec, ctx)) as client:
        await client.get("http://b.test/x", headers=[(b"X-Deadline-Ms", value)])
    sent = rec.seen[0]
    assert sent.headers.get_list("x-deadline-ms") == [value.decode(sent.headers.encoding)]
    assert max(sent.extensions["timeout"].values()) == pytest.approx(0.5)


async def test_negative_caller_deadline_is_not_sent() -> None:
    """A caller's X-Deadline-Ms of -5 is a spent budget: refused, never sent."""
    clock = FakeClock()
    rec = Recorder(clock, 200)
    async with httpx.AsyncClient(transport=_transport(clock, rec)) as client:
        with pytest.raises(DeadlineExceeded):
            await client.get("http://b.test/x", headers={"X-Deadline-Ms": "-5"})
    assert rec.seen == []


@pytest.mark.parametrize(
    ("retry_after", "blocked_s"),
    [(b"\xef\xbc\x91\xef\xbc\x90", 10.0), (b"99999999", 30.0), (b"\xff\xfe", 1.0), (b"-3", 0.0)],
)
async def test_hostile_retry_after_is_bounded(retry_after: bytes, blocked_s: float) -> None:
    """Retry-After from a downstream (non-ASCII, huge, negative) never blocks beyond the cap."""
    clock = FakeClock()

    def shed(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            429, headers=[(b"X-Ballast-Reason", b"limit"), (b"Retry-After", retry_after)]
        )

    transport = _transport(clock, shed)
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get("http://b.test/x")).status_code == 429
    state = transport.hosts.get("http://b.test:80")
    assert state.blocked_s(clock.t, Priority.STANDARD) == pytest.approx(blocked_s)


async def test_refused_originals_earn_no_retry_budget() -> None:
    """Calls refused before sending do not count as originals in the host's retry budget."""
    clock = FakeClock()
    transport = _transport(clock, Recorder(clock, 200), _ctx(clock, 0.0, Priority.STANDARD))
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(20):
            with pytest.raises(DeadlineExceeded):
                await client.get("http://b.test/x")
    budget = transport.hosts.get("http://b.test:80").budget
    assert budget.snapshot(clock.t)["originals_total"] == 0


async def test_client_section_sums_the_budget() -> None:
    """The snapshot's client section has totals, a budget summary and each host's state."""
    from ballast_asgi.client import client_section

    clock = FakeClock()
    transport = _transport(clock, Recorder(clock, 502, 200))
    async with httpx.AsyncClient(transport=transport) as client:
        await client.get("http://budget-sum.test/x")
    section = client_section()
    assert section["budget"]["granted"] >= 1
    assert section["budget"]["balance"] >= 0.0
    host = section["hosts"]["http://budget-sum.test:80"]
    assert host["retry_budget"]["retries_in_window"] == 1
    assert section["retried"] >= 1 and section["transports"] >= 1
