"""The shed decision (``core/shed.py``) and the one helper acting on it (``ShedResponder.act``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import Message, Receive, Scope, Send
from ballast_asgi.middleware.context import RequestContext
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.metrics import Metrics, null_metrics

pytestmark = pytest.mark.anyio

RATE_HEADERS = ((b"ratelimit", b'"default";r=0;t=3'),)


class Sink:
    """An ASGI ``send`` that keeps every message."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])


class Inner:
    """The next stage: records that it ran and with which ``send``."""

    def __init__(self) -> None:
        self.sends: list[Send] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.sends.append(send)


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _ctx() -> RequestContext:
    return RequestContext(arrival=0.0, deadline=None, priority=Priority.BULK)


def _sample(metrics: Metrics, name: str, reason: str, priority: str) -> float:
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name == name and s.labels == {"reason": reason, "priority": priority}:
                return s.value
    return 0.0


def test_shed_is_a_frozen_value() -> None:
    """A Shed compares by value and cannot be changed after the decision."""
    a = Shed(ShedReason.LIMIT, Priority.BULK)
    assert a == Shed(ShedReason.LIMIT, Priority.BULK)
    assert a.retry_after_s is None and a.headers == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.reason = ShedReason.CAPACITY  # type: ignore[misc]


def test_shed_refuses_a_negative_retry_after() -> None:
    """A negative retry_after_s is a bug in the deciding stage, caught at once."""
    with pytest.raises(ValueError, match="retry_after_s"):
        Shed(ShedReason.BREAKER_OPEN, Priority.STANDARD, retry_after_s=-1.0)


async def test_act_enforcing_sends_the_shed_and_skips_the_app() -> None:
    """Enforcing: counted, the 429 carries reason, Retry-After and the extra headers."""
    metrics = null_metrics()
    responder = ShedResponder(metrics)
    ctx, inner, sink = _ctx(), Inner(), Sink()
    shed = Shed(ShedReason.RATE_LIMITED, Priority.BULK, 2.2, RATE_HEADERS)
    await responder.act(shed, ctx, inner, {"type": "http"}, _receive, sink)
    assert inner.sends == []
    assert sink.messages[0]["status"] == 429
    headers = sink.headers()
    assert headers[b"x-ballast-reason"] == b"rate_limited"
    assert headers[b"retry-after"] == b"3"
    assert headers[b"ratelimit"] == b'"default";r=0;t=3'
    body = json.loads(sink.messages[1]["body"])
    assert body == {
        "error": "shed",
        "reason": "rate_limited",
        "priority": "bulk",
        "retry_after_s": 3,
    }
    assert ctx.shed_reason is ShedReason.RATE_LIMITED and ctx.would_shed == []
    assert _sample(metrics, "ballast_shed_total", "rate_limited", "bulk") == 1
    assert _sample(metrics, "ballast_dry_run_shed_total", "rate_limited", "bulk") == 0


async def test_act_dry_run_counts_marks_and_runs_the_app() -> None:
    """Dry-run: nothing is sent, the request is marked and continues with the stage's send."""
    metrics = null_metrics()
    responder = ShedResponder(metrics)
    responder.dry_run = True
    ctx, inner, sink = _ctx(), Inner(), Sink()
    shed = Shed(ShedReason.QUEUE_FULL, Priority.BULK, headers=RATE_HEADERS)
    await responder.act(shed, ctx, inner, {"type": "http"}, _receive, sink)
    assert inner.sends == [sink]
    assert sink.messages == []
    assert ctx.would_shed == [ShedReason.QUEUE_FULL] and ctx.shed_reason is None
    assert _sample(metrics, "ballast_dry_run_shed_total", "queue_full", "bulk") == 1
    assert _sample(metrics, "ballast_shed_total", "queue_full", "bulk") == 0


async def test_act_without_a_context_still_answers() -> None:
    """A stage used without admission (no context) can still shed: counted and answered."""
    metrics = null_metrics()
    sink = Sink()
    shed = Shed(ShedReason.CAPACITY, ShedResponder.priority_of(None))
    await ShedResponder(metrics).act(shed, None, Inner(), {"type": "http"}, _receive, sink)
    assert sink.messages[0]["status"] == 429
    assert int(sink.headers()[b"retry-after"]) >= 1
    assert _sample(metrics, "ballast_shed_total", "capacity", "standard") == 1


async def test_dry_run_counts_a_request_once_under_its_first_reason() -> None:
    """A request already marked would-shed is not counted again; the later reason is noted."""
    metrics = null_metrics()
    responder = ShedResponder(metrics)
    responder.dry_run = True
    ctx = _ctx()
    for reason in (ShedReason.DEADLINE, ShedReason.CAPACITY):
        await responder.act(Shed(reason, Priority.BULK), ctx, Inner(), {}, _receive, Sink())
    assert ctx.would_shed == [ShedReason.DEADLINE, ShedReason.CAPACITY]
    assert _sample(metrics, "ballast_dry_run_shed_total", "deadline", "bulk") == 1
    assert _sample(metrics, "ballast_dry_run_shed_total", "capacity", "bulk") == 0
