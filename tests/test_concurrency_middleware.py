"""ConcurrencyMiddleware: permits around the inner app and the outcome of each release."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from ballast_asgi.core.limit import FixedLimit, Sample
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import Outcome, ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import ASGIApp, Receive, Scope, Send
from ballast_asgi.metrics import Metrics, null_metrics
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware, outcome_for
from ballast_asgi.middleware.context import RequestContext, get_context
from ballast_asgi.middleware.responses import ShedResponder

pytestmark = pytest.mark.anyio


class Recording(FixedLimit):
    """A fixed limit remembering its samples."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.samples: list[Sample] = []

    def on_sample(self, sample: Sample, now: float) -> int:
        self.samples.append(sample)
        return self.limit


def status_app(status: int, before: Callable[[RequestContext], None] | None = None) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if before is not None:
            before(get_context(scope))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


def build(inner: ASGIApp, limit: int = 4) -> tuple[ASGIApp, Limiter, Recording, Metrics]:
    metrics = null_metrics()
    algo = Recording(limit)
    limiter = Limiter(algo)
    responder = ShedResponder(metrics)
    app = ConcurrencyMiddleware(inner, limiter=limiter, responder=responder, metrics=metrics)
    return AdmissionMiddleware(app, responder=responder, metrics=metrics), limiter, algo, metrics


async def get(app: ASGIApp) -> httpx.Response:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gw"
    ) as client:
        return await client.get("/")


async def test_success_releases_with_an_rtt_sample() -> None:
    """A 2xx response releases the permit as SUCCESS (one non-dropped sample)."""
    app, limiter, algo, _ = build(status_app(200))
    assert (await get(app)).status_code == 200
    assert limiter.inflight == 0
    assert [s.dropped for s in algo.samples] == [False]


async def test_5xx_releases_as_dropped() -> None:
    """A 5xx response is a congestion sample."""
    app, _, algo, _ = build(status_app(503))
    await get(app)
    assert [s.dropped for s in algo.samples] == [True]


async def test_inner_exception_releases_as_dropped_and_propagates() -> None:
    """An exception from the inner app is DROPPED and re-raised."""

    async def boom(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("upstream exploded")

    app, limiter, algo, _ = build(boom)
    with pytest.raises(RuntimeError):
        await get(app)
    assert limiter.inflight == 0
    assert [s.dropped for s in algo.samples] == [True]


@pytest.mark.parametrize(
    "mark",
    [
        lambda c: setattr(c, "client_gone", True),
        lambda c: setattr(c, "shed_reason", ShedReason.BREAKER_OPEN),
        lambda c: setattr(c, "outcome", Outcome.IGNORED),
    ],
)
async def test_ignored_cases_feed_no_sample(mark: Callable[[RequestContext], None]) -> None:
    """Client gone, shed downstream, or an explicit IGNORED leave no sample."""
    app, limiter, algo, _ = build(status_app(200, mark))
    await get(app)
    assert limiter.inflight == 0
    assert algo.samples == []


async def test_upstream_error_is_dropped_even_with_a_gateway_status() -> None:
    """ctx.upstream_error marks the release DROPPED."""
    app, _, algo, _ = build(status_app(504, lambda c: setattr(c, "upstream_error", "timeout")))
    await get(app)
    assert [s.dropped for s in algo.samples] == [True]


async def test_no_free_permit_sheds_with_limit() -> None:
    """Without a free permit the request gets 429 limit and the app is not called."""
    called: list[bool] = []
    app, limiter, _, metrics = build(status_app(200, lambda c: called.append(True)), limit=1)
    held = limiter.try_acquire(0.0)
    assert held is not None
    resp = await get(app)
    held.release(Outcome.IGNORED, 0.0)
    assert resp.status_code == 429
    assert resp.headers["x-ballast-reason"] == "limit"
    assert called == []
    value = metrics.registry.get_sample_value(
        "ballast_shed_total", {"reason": "limit", "priority": "standard"}
    )
    assert value == 1


async def test_cancellation_releases_as_ignored_and_propagates() -> None:
    """A cancelled request releases its permit as IGNORED and re-raises."""
    started = asyncio.Event()

    async def hang(scope: Scope, receive: Receive, send: Send) -> None:
        started.set()
        await asyncio.Event().wait()

    app, limiter, algo, _ = build(hang)
    task = asyncio.ensure_future(get(app))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limiter.inflight == 0 and algo.samples == []


async def test_permit_from_the_queue_is_used_not_a_new_one() -> None:
    """A permit already on the context is the one released; no second acquire."""
    metrics = null_metrics()
    limiter = Limiter(FixedLimit(1))
    responder = ShedResponder(metrics)
    inner = ConcurrencyMiddleware(
        status_app(200), limiter=limiter, responder=responder, metrics=metrics
    )

    async def grant(scope: Scope, receive: Receive, send: Send) -> None:
        get_context(scope).permit = limiter.try_acquire(0.0)
        await inner(scope, receive, send)

    app = AdmissionMiddleware(grant, responder=responder, metrics=metrics)
    assert (await get(app)).status_code == 200
    assert limiter.inflight == 0 and limiter.double_releases == 0


async def test_limiter_gauges_are_bound() -> None:
    """The limit and in-flight gauges read the limiter at scrape time."""
    _, _, _, metrics = build(status_app(200), limit=7)
    assert metrics.registry.get_sample_value("ballast_concurrency_limit") == 7
    assert metrics.registry.get_sample_value("ballast_inflight_requests") == 0


async def test_non_http_scopes_pass_through() -> None:
    """Lifespan scopes reach the inner app with no context and no permit."""
    seen: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    metrics = null_metrics()
    limiter = Limiter(FixedLimit(1))
    mw = ConcurrencyMiddleware(
        inner, limiter=limiter, responder=ShedResponder(metrics), metrics=metrics
    )
    noop: Callable[..., Awaitable[None]] = inner
    await mw({"type": "lifespan"}, noop, noop)  # type: ignore[arg-type]
    assert seen == ["lifespan"] and limiter.inflight == 0


def test_outcome_rule_order() -> None:
    """The explicit outcome wins; then gone/shed; then errors and 5xx; no response is IGNORED."""
    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    assert outcome_for(ctx, 200, None) is Outcome.SUCCESS
    assert outcome_for(ctx, 500, None) is Outcome.DROPPED
    assert outcome_for(ctx, None, None) is Outcome.IGNORED
    assert outcome_for(ctx, None, asyncio.CancelledError()) is Outcome.IGNORED
    assert outcome_for(ctx, None, ValueError()) is Outcome.DROPPED
    ctx.outcome = Outcome.DROPPED
    assert outcome_for(ctx, 200, None) is Outcome.DROPPED
