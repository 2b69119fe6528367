"""AdmissionMiddleware through httpx.ASGITransport: headers, dead on arrival, early drop."""

from __future__ import annotations

import httpx
import pytest

from ballast_asgi.config import PriorityConfig, PriorityRule
from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.early_drop import EarlyDropEstimator
from ballast_asgi.core.limit import FixedLimit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.context import RequestContext, get_context
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.metrics import Metrics, null_metrics
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


class Inner:
    """A tiny ASGI app that records the context it saw and answers 200."""

    def __init__(self) -> None:
        self.seen: list[RequestContext] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.seen.append(get_context(scope))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def build(**kw: object) -> tuple[AdmissionMiddleware, Inner, Metrics]:
    metrics = null_metrics()
    inner = Inner()
    params: dict[str, object] = {"responder": ShedResponder(metrics), "metrics": metrics}
    params.update(kw)
    return AdmissionMiddleware(inner, **params), inner, metrics  # type: ignore[arg-type]


async def get(app: AdmissionMiddleware, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await client.get("/x", headers=headers or {})


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.mark.parametrize("header", ["X-Deadline-Ms", "X-Priority"])
@pytest.mark.parametrize("value", ["soon", "nan", "inf", "99999999999", "urgent"])
async def test_malformed_header_gets_400_naming_it(header: str, value: str) -> None:
    """A malformed X-Deadline-Ms or X-Priority is a 400 whose message names the header."""
    app, inner, metrics = build()
    resp = await get(app, {header: value})
    assert resp.status_code == 400
    assert resp.json()["header"] == header
    assert header in resp.json()["message"]
    assert inner.seen == []
    assert sample(metrics, "ballast_bad_requests_total", header=header) == 1


@pytest.mark.parametrize("budget", ["0", "-5", "-0.5"])
async def test_dead_on_arrival_is_shed_without_calling_the_app(budget: str) -> None:
    """A spent budget sheds with reason deadline and never reaches the inner app."""
    app, inner, metrics = build()
    resp = await get(app, {"X-Deadline-Ms": budget, "X-Priority": "bulk"})
    assert resp.status_code == 429
    assert resp.headers["x-ballast-reason"] == "deadline"
    assert int(resp.headers["retry-after"]) >= 1
    assert inner.seen == []
    assert sample(metrics, "ballast_shed_total", reason="deadline", priority="bulk") == 1


async def test_context_carries_priority_and_absolute_deadline() -> None:
    """The inner app sees the tier and arrival + budget on the injected clock."""
    clock = FakeClock(100.0)
    app, inner, metrics = build(clock=clock)
    resp = await get(app, {"X-Deadline-Ms": "250", "X-Priority": "CRITICAL"})
    assert resp.status_code == 200
    (ctx,) = inner.seen
    assert ctx.priority is Priority.CRITICAL
    assert ctx.arrival == 100.0
    assert ctx.deadline == pytest.approx(100.25)
    assert sample(metrics, "ballast_requests_total", priority="critical") == 1


async def test_defaults_apply_without_headers() -> None:
    """Without headers the configured default tier and deadline apply."""
    app, inner, _ = build(
        clock=FakeClock(10.0), default_priority=Priority.BULK, default_deadline_ms=1000
    )
    await get(app)
    (ctx,) = inner.seen
    assert ctx.priority is Priority.BULK
    assert ctx.deadline == pytest.approx(11.0)


async def test_no_default_deadline_means_none() -> None:
    """Without header or default the request has no deadline."""
    app, inner, _ = build()
    await get(app)
    assert inner.seen[0].deadline is None
    assert inner.seen[0].priority is Priority.STANDARD


async def test_classifier_chooses_the_tier() -> None:
    """With a Classifier, rules decide when the header is absent; a trusted header wins."""
    config = PriorityConfig(rules=(PriorityRule(path="/x", priority=Priority.BULK),))
    app, inner, _ = build(classifier=Classifier(config))
    await get(app)
    await get(app, {"X-Priority": "0"})
    assert [c.priority for c in inner.seen] == [Priority.BULK, Priority.CRITICAL]


async def test_untrusted_malformed_priority_is_ignored_not_rejected() -> None:
    """An untrusted peer's X-Priority is ignored (even malformed) and counted."""
    app, inner, metrics = build(classifier=Classifier(PriorityConfig(trust_header=False)))
    response = await get(app, {"X-Priority": "urgent!!"})
    assert response.status_code == 200
    assert inner.seen[0].priority is Priority.STANDARD
    assert metrics.registry.get_sample_value("ballast_priority_header_ignored_total") == 1.0


class AlwaysDrop:
    def should_drop(self, remaining_s: float, priority: Priority, now: float) -> bool:
        return True


async def test_early_drop_sheds_with_its_reason() -> None:
    """An estimator saying the deadline cannot be met sheds with early_drop."""
    app, inner, _ = build(early_drop=AlwaysDrop())
    resp = await get(app, {"X-Deadline-Ms": "100"})
    assert resp.headers["x-ballast-reason"] == "early_drop"
    assert inner.seen == []


async def test_early_drop_skips_requests_without_deadline() -> None:
    """A request without a deadline can always make it."""
    app, _, _ = build(early_drop=AlwaysDrop())
    assert (await get(app)).status_code == 200


async def test_early_drop_uses_the_limiter_minimum_rtt() -> None:
    """A budget shorter than the minimum service time is shed early; a longer one passes."""
    limiter = Limiter(FixedLimit(10))
    permit = limiter.try_acquire(0.0)
    assert permit is not None
    permit.release(Outcome.SUCCESS, 0.2)
    app, _, _ = build(early_drop=EarlyDropEstimator(limiter))
    short = await get(app, {"X-Deadline-Ms": "50"})
    long = await get(app, {"X-Deadline-Ms": "500"})
    assert short.headers["x-ballast-reason"] == "early_drop"
    assert long.status_code == 200


async def test_non_http_scopes_pass_through() -> None:
    """Lifespan and websocket scopes reach the inner app untouched."""
    seen: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)

    metrics = null_metrics()
    mw = AdmissionMiddleware(app, responder=ShedResponder(metrics), metrics=metrics)
    scope: Scope = {"type": "lifespan"}

    async def receive() -> dict[str, object]:
        return {}

    async def send(message: object) -> None:
        return None

    await mw(scope, receive, send)
    assert seen == [scope]


def test_rejects_bad_default_deadline() -> None:
    """A non-positive default deadline is a ValueError naming the field."""
    with pytest.raises(ValueError, match="default_deadline_ms"):
        build(default_deadline_ms=0)
