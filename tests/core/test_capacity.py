"""The capacity cap: the pure Capacity/ByteBudget core and CapacityMiddleware."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast_asgi.config import build_config
from ballast_asgi.core.capacity import ByteBudget, Capacity
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import Message, Receive, Scope, Send
from ballast_asgi.gateway import build_gateway
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.body import BodyMiddleware
from ballast_asgi.middleware.capacity import CapacityMiddleware
from ballast_asgi.middleware.context import RequestContext, with_context
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.metrics import Metrics, null_metrics

# -- pure core ------------------------------------------------------------------


def test_byte_budget_reserves_until_full_and_releases() -> None:
    """Reservations succeed while they fit, fail without side effect, and are given back."""
    b = ByteBudget(100)
    assert b.try_reserve(60)
    assert not b.try_reserve(41)
    assert b.used_bytes == 60
    assert b.try_reserve(40)
    b.release(60)
    assert b.used_bytes == 40
    assert b.peak_bytes == 100


def test_byte_budget_zero_bytes_always_fits() -> None:
    """A request without a body needs no budget, even when the budget is exhausted."""
    b = ByteBudget(0)
    assert b.try_reserve(0)
    assert not b.try_reserve(1)


def test_capacity_keeps_the_reserve_for_critical() -> None:
    """Non-critical tiers stop at cap minus the reserve; critical may use the whole cap."""
    cap = Capacity(10, max_buffered_bytes=0, reserved_fraction=0.2)
    assert all(cap.try_enter(Priority.BULK) for _ in range(8))
    assert not cap.try_enter(Priority.STANDARD)
    assert cap.try_enter(Priority.CRITICAL)
    assert cap.try_enter(Priority.CRITICAL)
    assert not cap.try_enter(Priority.CRITICAL)
    assert cap.held == 10
    assert cap.refused == 2


def test_capacity_refuses_when_body_does_not_fit() -> None:
    """A request whose declared body exceeds the byte budget is refused and not counted held."""
    cap = Capacity(10, max_buffered_bytes=1000)
    assert cap.try_enter(Priority.STANDARD, 800)
    assert not cap.try_enter(Priority.CRITICAL, 300)
    assert cap.held == 1
    cap.leave(800)
    assert cap.held == 0
    assert cap.byte_budget.used_bytes == 0


@pytest.mark.parametrize(
    ("max_held", "max_bytes", "fraction"), [(0, 10, 0.1), (5, -1, 0.1), (5, 10, 1.5)]
)
def test_capacity_rejects_invalid_bounds(max_held: int, max_bytes: int, fraction: float) -> None:
    """Invalid bounds are refused at construction with a ValueError."""
    with pytest.raises(ValueError):
        Capacity(max_held, max_buffered_bytes=max_bytes, reserved_fraction=fraction)


@given(
    st.integers(1, 50),
    st.floats(0.0, 1.0),
    st.lists(st.tuples(st.booleans(), st.sampled_from(list(Priority))), max_size=200),
)
def test_capacity_never_exceeds_its_cap(max_held: int, fraction: float, ops: list[object]) -> None:
    """Any sequence of enters and leaves keeps 0 <= held <= max_held."""
    cap = Capacity(max_held, max_buffered_bytes=0, reserved_fraction=fraction)
    inside = 0
    for enter, priority in ops:  # type: ignore[misc]
        if enter:
            inside += cap.try_enter(priority)
        elif inside:
            cap.leave()
            inside -= 1
        assert 0 <= cap.held == inside <= max_held


# -- middleware -----------------------------------------------------------------


class Held:
    """Inner app that holds each request until ``release`` is set."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.entered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


class Exchange:
    """A fake client side: a receive that records reads, a send that records messages."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.reads = 0

    async def receive(self) -> Message:
        self.reads += 1
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])


def http_scope(priority: Priority = Priority.STANDARD, length: int | None = None) -> Scope:
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope: Scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    return with_context(scope, RequestContext(arrival=0.0, deadline=None, priority=priority))


def build(
    max_held: int, max_bytes: int = 1 << 20, fraction: float = 0.0
) -> tuple[CapacityMiddleware, Held, Capacity, Metrics]:
    metrics = Metrics()
    inner = Held()
    cap = Capacity(max_held, max_buffered_bytes=max_bytes, reserved_fraction=fraction)
    return (
        CapacityMiddleware(inner, capacity=cap, responder=ShedResponder(metrics)),
        inner,
        cap,
        metrics,
    )


def shed_count(metrics: Metrics, priority: str) -> float:
    labels = {"reason": "capacity", "priority": priority}
    return metrics.registry.get_sample_value("ballast_shed_total", labels) or 0.0


@pytest.mark.anyio
async def test_at_cap_a_new_request_is_shed_before_its_body_is_read() -> None:
    """At the cap a newcomer gets 429 capacity at once; its receive is never called."""
    app, inner, cap, metrics = build(max_held=2)
    held = [Exchange(), Exchange()]
    late = Exchange()
    async with anyio.create_task_group() as tg:
        for ex in held:
            tg.start_soon(app, http_scope(), ex.receive, ex.send)
        while inner.entered < 2:
            await anyio.lowlevel.checkpoint()
        scope = http_scope(Priority.BULK)
        await app(scope, late.receive, late.send)
        assert late.status == 429
        assert late.headers[b"x-ballast-reason"] == b"capacity"
        assert late.reads == 0
        assert scope["ballast"].shed_reason is not None
        assert cap.held == 2
        inner.release.set()
    assert [ex.status for ex in held] == [200, 200]
    assert cap.held == 0
    assert shed_count(metrics, "bulk") == 1


@pytest.mark.anyio
async def test_critical_uses_the_reserve_when_others_are_refused() -> None:
    """With a reserve, a critical request is admitted where a bulk one is shed."""
    app, inner, cap, _ = build(max_held=4, fraction=0.5)
    async with anyio.create_task_group() as tg:
        for _ in range(2):
            ex = Exchange()
            tg.start_soon(app, http_scope(Priority.BULK), ex.receive, ex.send)
        while inner.entered < 2:
            await anyio.lowlevel.checkpoint()
        bulk = Exchange()
        await app(http_scope(Priority.BULK), bulk.receive, bulk.send)
        crit = Exchange()
        tg.start_soon(app, http_scope(Priority.CRITICAL), crit.receive, crit.send)
        while inner.entered < 3:
            await anyio.lowlevel.checkpoint()
        assert bulk.status == 429
        assert cap.held == 3
        inner.release.set()
    assert crit.status == 200
    assert cap.held == 0


@pytest.mark.anyio
async def test_a_declared_body_reserves_no_bytes() -> None:
    """A Content-Length alone reserves nothing: an idle upload cannot hold the byte budget."""
    app, inner, cap, _ = build(max_held=10, max_bytes=1000)
    async with anyio.create_task_group() as tg:
        ex = Exchange()
        tg.start_soon(app, http_scope(length=100_000), ex.receive, ex.send)
        while inner.entered < 1:
            await anyio.lowlevel.checkpoint()
        assert cap.byte_budget.used_bytes == 0
        inner.release.set()
    assert ex.status == 200


@pytest.mark.anyio
async def test_count_is_released_once_when_the_inner_app_raises() -> None:
    """An inner exception propagates and the held count goes back to 0 exactly once."""

    async def boom(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    cap = Capacity(1, max_buffered_bytes=100)
    app = CapacityMiddleware(boom, capacity=cap, responder=ShedResponder(null_metrics()))
    ex = Exchange()
    with pytest.raises(RuntimeError):
        await app(http_scope(length=50), ex.receive, ex.send)
    assert (cap.held, cap.byte_budget.used_bytes) == (0, 0)


@pytest.mark.anyio
async def test_count_is_released_when_the_request_is_cancelled() -> None:
    """A cancelled request (client gone, server shutdown) leaves the count."""
    app, inner, cap, _ = build(max_held=1)
    async with anyio.create_task_group() as tg:
        ex = Exchange()
        tg.start_soon(app, http_scope(), ex.receive, ex.send)
        while inner.entered < 1:
            await anyio.lowlevel.checkpoint()
        assert cap.held == 1
        tg.cancel_scope.cancel()
    assert cap.held == 0


@pytest.mark.anyio
async def test_non_http_scopes_pass_through_uncounted() -> None:
    """Lifespan and websocket scopes go straight to the inner app."""
    seen: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    cap = Capacity(1, max_buffered_bytes=0)
    app = CapacityMiddleware(inner, capacity=cap, responder=ShedResponder(null_metrics()))
    ex = Exchange()
    await app({"type": "lifespan"}, ex.receive, ex.send)
    assert seen == ["lifespan"]
    assert cap.held == 0


# -- in the stack ---------------------------------------------------------------


def _chain(app: object) -> list[type]:
    kinds = []
    while app is not None:
        kinds.append(type(app))
        app = getattr(app, "app", None)
    return kinds


def test_stack_puts_capacity_inside_admission_and_outside_the_queue() -> None:
    """build_stack orders Admission -> Capacity -> Body -> Queue."""
    gw = build_gateway(build_config({"upstream": "http://127.0.0.1:9"}))
    kinds = _chain(gw._app)
    i = kinds.index(AdmissionMiddleware)
    assert kinds[i + 1 : i + 4] == [CapacityMiddleware, BodyMiddleware, QueueMiddleware]
    assert gw.snapshot()["capacity"]["max_held"] == 4096


@pytest.mark.anyio
async def test_gateway_answers_dead_on_arrival_before_the_cap() -> None:
    """At the cap, a dead-on-arrival request is still shed as deadline (admission first)."""
    gw = build_gateway(
        build_config({"upstream": "http://127.0.0.1:9", "capacity": {"max_held_requests": 1}})
    )
    cap = gw.parts.capacity
    assert cap is not None
    assert cap.try_enter(Priority.CRITICAL)  # the cap is now full
    headers = [(b"x-deadline-ms", b"0")]
    doa, full = Exchange(), Exchange()
    await gw(
        {"type": "http", "method": "GET", "path": "/", "headers": headers}, doa.receive, doa.send
    )
    await gw({"type": "http", "method": "GET", "path": "/", "headers": []}, full.receive, full.send)
    cap.leave()
    assert doa.headers[b"x-ballast-reason"] == b"deadline"
    assert full.headers[b"x-ballast-reason"] == b"capacity"
    assert cap.held == 0
