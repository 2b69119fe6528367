"""The cheap shed path (issue 18): responses built once, decided before a context."""

from __future__ import annotations

import gc
import json
import random
from typing import Any

import httpx
import pytest

from ballast_asgi.config import load_config
from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import Message, Receive, Scope, Send
from ballast_asgi.gateway import Gateway, build_gateway
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.responses import ShedResponder, send_json
from ballast_asgi.telemetry.metrics import Metrics
from tests.fakes import EchoHandler

pytestmark = pytest.mark.anyio


class Sink:
    """An ASGI ``send`` that keeps every message."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)


async def _old_shed(send: Send, status: int, shed: Shed, seconds: int) -> None:
    """The shed response as the responder built it before issue 18 (the reference)."""
    headers = [
        (b"retry-after", str(seconds).encode()),
        (b"x-ballast-reason", shed.reason.value.encode()),
        *shed.headers,
    ]
    payload: dict[str, object] = {
        "error": "shed",
        "reason": shed.reason.value,
        "priority": shed.priority.label,
        "retry_after_s": seconds,
    }
    await send_json(send, status, payload, headers)


@pytest.mark.parametrize("reason", list(ShedReason))
@pytest.mark.parametrize("priority", list(Priority))
async def test_shed_messages_equal_the_old_path(reason: ShedReason, priority: Priority) -> None:
    """Every reason and tier: the same two messages as before, byte for byte, twice over."""
    responder = ShedResponder(Metrics(), status=503)
    for seconds in (1, 7, 1):  # the second 1 comes from the built response
        shed = Shed(reason, priority, retry_after_s=seconds)
        new, old = Sink(), Sink()
        await responder.shed(new, shed)
        await _old_shed(old, 503, shed, seconds)
        assert new.messages == old.messages
        assert json.loads(new.messages[1]["body"])["retry_after_s"] == seconds


async def test_extra_headers_are_sent_and_never_kept() -> None:
    """A shed with extra headers (the rate limit's) gets them; a later plain one does not."""
    responder = ShedResponder(Metrics())
    extra = ((b"ratelimit", b'"default";r=0;t=3'),)
    with_extra, old, plain = Sink(), Sink(), Sink()
    shed = Shed(ShedReason.RATE_LIMITED, Priority.BULK, retry_after_s=3, headers=extra)
    await responder.shed(with_extra, shed)
    await _old_shed(old, 429, shed, 3)
    assert with_extra.messages == old.messages
    await responder.shed(plain, Shed(ShedReason.RATE_LIMITED, Priority.BULK, retry_after_s=3))
    assert (b"ratelimit", b'"default";r=0;t=3') not in plain.messages[0]["headers"]


async def test_each_response_gets_its_own_header_list() -> None:
    """A middleware outside that edits one shed's headers in place changes no later shed."""
    responder = ShedResponder(Metrics())
    first, second = Sink(), Sink()
    shed = Shed(ShedReason.LIMIT, Priority.STANDARD, retry_after_s=2)
    await responder.shed(first, shed)
    first.messages[0]["headers"].append((b"x-added", b"1"))
    await responder.shed(second, shed)
    assert (b"x-added", b"1") not in second.messages[0]["headers"]
    assert first.messages[0]["headers"] is not second.messages[0]["headers"]


async def test_drain_estimate_retry_after_still_jittered_and_counted() -> None:
    """Without an explicit value Retry-After is the jittered drain estimate; each shed counted."""
    metrics = Metrics()
    responder = ShedResponder(metrics, rng=random.Random(3), jitter=0.25)
    responder.drain_estimate = lambda: 10.0
    seen = set()
    for _ in range(40):
        sink = Sink()
        await responder.shed(sink, Shed(ShedReason.CAPACITY, Priority.BULK))
        seen.add(int(dict(sink.messages[0]["headers"])[b"retry-after"]))
    assert seen <= set(range(8, 14)) and len(seen) > 2
    assert _count(metrics, "ballast_shed_total", reason="capacity", priority="bulk") == 40


@pytest.mark.parametrize("drain", [0.0, 0.4, 1.0, 2.5, 10.0, 59.9, 500.0, float("nan")])
def test_response_retry_after_is_retry_after_s_drawn_the_same_way(drain: float) -> None:
    """``response`` computes Retry-After as ``retry_after_s`` does: same draws, same values."""
    inline = ShedResponder(Metrics(), rng=random.Random(7), jitter=0.3, max_retry_after_s=30)
    method = ShedResponder(Metrics(), rng=random.Random(7), jitter=0.3, max_retry_after_s=30)
    inline.drain_estimate = method.drain_estimate = lambda: drain
    shed = Shed(ShedReason.LIMIT, Priority.CRITICAL)
    got = [inline.response(shed)[1] for _ in range(200)]
    assert got == [method.retry_after_s() for _ in range(200)]
    given = (Shed(ShedReason.LIMIT, Priority.CRITICAL, s) for s in (0, 0.2, 3))
    explicit = [inline.response(g)[1] for g in given]
    assert explicit == [1, 1, 3]


def _count(metrics: Metrics, name: str, **labels: str) -> float:
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


class Never:
    """An inner app that must not run."""

    calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1


async def _receive() -> Message:
    raise AssertionError("a shed reads no request body")


def _scope(deadline: bytes) -> dict[str, Any]:
    headers = [(b"host", b"gw"), (b"x-deadline-ms", deadline)]
    return {"type": "http", "method": "POST", "path": "/", "raw_path": b"/", "headers": headers}


async def test_admission_sheds_dead_on_arrival_without_a_context() -> None:
    """Enforcing: the DOA shed is answered from the head alone; counted; no body read."""
    metrics = Metrics()
    inner = Never()
    stage = AdmissionMiddleware(inner, responder=ShedResponder(metrics), metrics=metrics)
    admitted = stage.stage.admit(_scope(b"0"))
    assert isinstance(admitted, Shed) and admitted.reason is ShedReason.DEADLINE
    sink = Sink()
    scope = _scope(b"0")
    await stage(scope, _receive, sink)
    assert inner.calls == 0 and "ballast" not in scope
    assert sink.messages[0]["status"] == 429
    assert dict(sink.messages[0]["headers"])[b"x-ballast-reason"] == b"deadline"
    # admit() alone counts the request; the shed is counted when it is sent
    assert _count(metrics, "ballast_shed_total", reason="deadline", priority="standard") == 1
    assert _count(metrics, "ballast_requests_total", priority="standard") == 2


async def test_admission_dry_run_still_builds_the_context_and_runs_the_app() -> None:
    """Dry-run: the would-be shed gets its context, is counted and admitted."""
    metrics = Metrics()
    responder = ShedResponder(metrics)
    responder.dry_run = True
    inner = Never()
    stage = AdmissionMiddleware(inner, responder=responder, metrics=metrics)
    await stage(_scope(b"0"), _receive, Sink())
    assert inner.calls == 1
    assert _count(metrics, "ballast_dry_run_shed_total", reason="deadline", priority="standard")


def _gateway(up: EchoHandler) -> Gateway:
    config = load_config(env={"BALLAST_UPSTREAM": "http://up.test"})
    return build_gateway(config, transport=httpx.MockTransport(up), env={})


@pytest.mark.parametrize(
    ("path", "passes"),
    [("/orders/1", True), ("/_ballastic", False), ("/_ballast/health", False), ("/", True)],
)
def test_admin_router_passes_only_paths_outside_its_prefix(path: str, passes: bool) -> None:
    """``passes``: outside the prefix; ``/_ballastic`` is left to the router (it passes it on)."""
    gw = _gateway(EchoHandler())
    scope = {"type": "http", "path": path, "root_path": ""}
    assert gw._router.passes(scope) is passes
    assert gw.admin_app().passes(scope) is False  # the admin port's router answers everything


async def test_gateway_fast_path_keeps_admin_and_pass_through_answers() -> None:
    """Through the gateway: admin paths answered, others proxied (the router's level skipped)."""
    up = EchoHandler()
    gw = _gateway(up)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://gw") as c:
        health = await c.get("/_ballast/health")
        proxied = await c.get("/orders/1")
        near = await c.get("/_ballastic")
        unknown = await c.get("/_ballast/nope")
    assert health.json() == {"status": "ok"}
    assert proxied.status_code == 200 and proxied.json()["path"] == "/orders/1"
    assert near.status_code == 200 and up.calls == 2
    assert unknown.status_code == 404


async def test_gateway_fast_path_under_a_root_path_keeps_admin_and_pass_through() -> None:
    """Mounted at a root path: the admin prefix is judged on the path below it."""
    up = EchoHandler()
    gw = _gateway(up)
    transport = httpx.ASGITransport(gw, root_path="/api")
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        health = await c.get("/api/_ballast/health")
        proxied = await c.get("/api/orders/1")
    assert health.json() == {"status": "ok"}
    assert proxied.status_code == 200 and up.calls == 1
    dead = [(b"x-deadline-ms", b"0")]
    gw.server_may_rewrite = False
    assert gw.shed_at_wire("GET", "/api/_ballast/x", b"/api/_ballast/x", dead, None, "/api") is None
    shed = gw.shed_at_wire("GET", "/api/orders", b"/api/orders", dead, None, "/api")
    assert shed is not None and shed[0].reason is ShedReason.DEADLINE


async def test_lifespan_start_up_freezes_the_collector() -> None:
    """Once start-up completed, what it built is in the permanent generation."""
    gc.unfreeze()
    inbox = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    replies: list[str] = []
    frozen: list[int] = []

    async def receive() -> Message:
        return next(inbox)

    async def send(message: Message) -> None:
        replies.append(message["type"])
        frozen.append(gc.get_freeze_count())

    try:
        await _gateway(EchoHandler())({"type": "lifespan"}, receive, send)
    finally:
        gc.unfreeze()
    assert replies == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert frozen[0] > 0
