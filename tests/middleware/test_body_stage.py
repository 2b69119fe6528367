"""BodyMiddleware: bodies read before queueing, under a read timeout and a minimum rate.

Waiting is driven by an injected ``wait`` on a fake clock: no test sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.core.capacity import ByteBudget
from ballast_asgi.core.head import HeadLimits, read_head
from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import Message, Receive, Scope, Send
from ballast_asgi.gateway import build_gateway
from ballast_asgi.middleware.body import BodyMiddleware
from ballast_asgi.middleware.context import RequestContext, find_context, with_context
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.metrics import Metrics
from tests.fakes import FakeClock, request_messages

pytestmark = pytest.mark.anyio

NEVER: Message = {"type": "never"}


class Trickle:
    """A client sending ``step`` bytes every ``gap_s`` seconds of the fake clock, forever."""

    def __init__(self, clock: FakeClock, gap_s: float, step: int = 1) -> None:
        self.clock = clock
        self.gap_s = gap_s
        self.step = step

    async def wait(self, message: Awaitable[Message], seconds: float) -> Message:
        """The injected ``wait``: the next chunk comes after ``gap_s``, or the wait times out."""
        if hasattr(message, "close"):
            message.close()  # type: ignore[union-attr]
        if self.gap_s > seconds:
            self.clock.advance(seconds)
            raise TimeoutError
        self.clock.advance(self.gap_s)
        return {"type": "http.request", "body": b"x" * self.step, "more_body": True}


class Inner:
    """Records the body it reads and the context's replayable body."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.replayable: list[bytes | None] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        self.bodies.append(body)
        ctx = find_context(scope)
        self.replayable.append(None if ctx is None else ctx.body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _scope(headers: list[tuple[bytes, bytes]]) -> Scope:
    scope: Scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    ctx = RequestContext(
        arrival=0.0, deadline=None, priority=Priority.STANDARD,
        head=read_head(headers, HeadLimits()),
    )  # fmt: skip
    return with_context(scope, ctx)


async def _call(app: BodyMiddleware, scope: Scope, incoming: list[Message]) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def _stage(
    inner: Inner, clock: FakeClock, *, wait: object = None, **kw: object
) -> tuple[BodyMiddleware, Metrics, ByteBudget]:
    metrics = Metrics()
    budget = ByteBudget(1 << 20)
    options: dict[str, object] = {"clock": clock, "byte_budget": budget, **kw}
    if wait is not None:
        options["wait"] = wait
    stage = BodyMiddleware(inner, responder=ShedResponder(metrics), metrics=metrics, **options)  # type: ignore[arg-type]
    return stage, metrics, budget


async def test_a_one_byte_per_second_trickle_gets_408_without_reaching_the_app() -> None:
    """1 byte/s is under the minimum rate: 408 after the grace, the inner app never runs."""
    clock = FakeClock(0.0)
    inner = Inner()
    trickle = Trickle(clock, gap_s=1.0)
    stage, metrics, budget = _stage(
        inner, clock, wait=trickle.wait, read_timeout_ms=5_000, min_rate_bytes_per_s=1024
    )
    sent = await _call(stage, _scope([(b"content-length", b"100000")]), [])
    assert sent[0]["status"] == 408
    assert inner.bodies == []
    assert clock.now <= 5.1  # cut within the grace, not after 100000 s
    assert (
        metrics.registry.get_sample_value("ballast_body_timeouts_total", {"phase": "buffer"}) == 1
    )
    assert budget.used_bytes == 0


async def test_a_stalled_upload_gets_408_after_the_read_timeout() -> None:
    """No chunk for read_timeout_ms: 408."""
    clock = FakeClock(0.0)
    inner = Inner()
    stall = Trickle(clock, gap_s=60.0)
    stage, _, _ = _stage(inner, clock, wait=stall.wait, read_timeout_ms=2_000)
    sent = await _call(stage, _scope([(b"transfer-encoding", b"chunked")]), [])
    assert sent[0]["status"] == 408 and clock.now == pytest.approx(2.0)


async def test_a_complete_body_is_replayable_and_its_bytes_counted_while_held() -> None:
    """A body under replay_max_bytes is read whole, put on the context, and counted."""
    clock = FakeClock(0.0)
    seen_budget: list[int] = []
    budget_box: list[ByteBudget] = []

    class Watching(Inner):
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            seen_budget.append(budget_box[0].used_bytes)
            await super().__call__(scope, receive, send)

    inner = Watching()
    stage, _, budget = _stage(inner, clock)
    budget_box.append(budget)
    body = b"a" * 3000
    sent = await _call(
        stage, _scope([(b"transfer-encoding", b"chunked")]), request_messages(body, chunk=1000)
    )
    assert sent[0]["status"] == 200
    assert inner.bodies == [body] and inner.replayable == [body]
    assert seen_budget == [3000] and budget.used_bytes == 0


async def test_a_body_over_the_replay_size_streams_and_is_not_replayable() -> None:
    """Past replay_max_bytes the rest streams to the app; ctx.body stays None."""
    clock = FakeClock(0.0)
    inner = Inner()
    stage, _, _ = _stage(inner, clock, replay_max_bytes=1500)
    body = b"b" * 5000
    await _call(stage, _scope([(b"content-length", b"5000")]), request_messages(body, chunk=1000))
    assert inner.bodies == [body] and inner.replayable == [None]


async def test_a_chunked_body_over_the_limit_gets_413_while_buffering() -> None:
    """A chunked upload that passes max_body_bytes is refused with 413."""
    clock = FakeClock(0.0)
    inner = Inner()
    stage, _, budget = _stage(inner, clock, max_body_bytes=2500)
    sent = await _call(
        stage, _scope([(b"transfer-encoding", b"chunked")]), request_messages(b"c" * 3000, 1000)
    )
    assert sent[0]["status"] == 413 and inner.bodies == [] and budget.used_bytes == 0


async def test_a_client_gone_during_the_body_costs_nothing() -> None:
    """A disconnect while the body is read: no response, no app call, bytes given back."""
    clock = FakeClock(0.0)
    inner = Inner()
    stage, _, budget = _stage(inner, clock)
    incoming = [{"type": "http.request", "body": b"part", "more_body": True}]
    sent = await _call(stage, _scope([(b"content-length", b"10")]), incoming)
    assert sent == [] and inner.bodies == [] and budget.used_bytes == 0


async def test_a_trickling_upload_holds_no_permit_in_the_gateway() -> None:
    """While a body is still being read no concurrency permit is held: GETs are served."""
    calls: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        return httpx.Response(200)

    config = build_config(
        {
            "upstream": "http://up.test",
            "max_concurrent_requests": 1,
            "admission_queue": {"enabled": False},
        }
    )
    gw = build_gateway(config, transport=httpx.MockTransport(upstream), env={})
    release = asyncio.Event()

    async def slow_receive() -> Message:
        await release.wait()
        return {"type": "http.disconnect"}

    async def ignore(message: Message) -> None:
        return None

    scope = {
        "type": "http", "method": "POST", "path": "/up", "raw_path": b"/up", "query_string": b"",
        "headers": [(b"content-length", b"10")], "client": ("127.0.0.1", 1), "root_path": "",
        "scheme": "http",
    }  # fmt: skip
    upload = asyncio.ensure_future(gw(scope, slow_receive, ignore))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://gw") as c:
        r = await c.get("/get")
    release.set()
    await upload
    assert r.status_code == 200 and calls == ["GET"]
    assert gw.parts.limiter.inflight == 0


def _budget_stage(
    inner: Inner, max_bytes: int, dry_run: bool
) -> tuple[BodyMiddleware, Metrics, ByteBudget]:
    metrics = Metrics()
    budget = ByteBudget(max_bytes)
    responder = ShedResponder(metrics)
    responder.dry_run = dry_run
    stage = BodyMiddleware(inner, responder=responder, metrics=metrics, byte_budget=budget)
    return stage, metrics, budget


def _capacity_sheds(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"reason": "capacity", "priority": "standard"})


async def test_a_full_byte_budget_sheds_with_capacity() -> None:
    """A chunk the byte budget cannot hold: 429 capacity, the app never runs, bytes given back."""
    inner = Inner()
    stage, metrics, budget = _budget_stage(inner, 4, dry_run=False)
    body = request_messages(b"0123456789", chunk=3)
    sent = await _call(stage, _scope([(b"content-length", b"10")]), body)
    assert sent[0]["status"] == 429
    assert dict(sent[0]["headers"])[b"x-ballast-reason"] == b"capacity"
    assert inner.bodies == [] and budget.used_bytes == 0
    assert _capacity_sheds(metrics, "ballast_shed_total") == 1


async def test_dry_run_counts_a_full_byte_budget_once_and_passes_the_body_on() -> None:
    """Dry-run: the would-be capacity shed is counted once; the app gets the whole body."""
    inner = Inner()
    stage, metrics, budget = _budget_stage(inner, 4, dry_run=True)
    scope = _scope([(b"content-length", b"10")])
    sent = await _call(stage, scope, request_messages(b"0123456789", chunk=3))
    assert sent[0]["status"] == 200 and inner.bodies == [b"0123456789"]
    assert budget.used_bytes == 0
    assert _capacity_sheds(metrics, "ballast_dry_run_shed_total") == 1
    assert _capacity_sheds(metrics, "ballast_shed_total") in (None, 0.0)
    ctx = find_context(scope)
    assert ctx is not None and ctx.would_shed == [ShedReason.CAPACITY]
