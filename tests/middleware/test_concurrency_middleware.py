"""ConcurrencyMiddleware: permits around the inner app and the outcome of each release."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from ballast_asgi.core.limit import FixedLimit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import AttemptOutcome, Outcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import ASGIApp, Receive, Scope, Send
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware, release
from ballast_asgi.middleware.context import RequestContext, get_context
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.metrics import Metrics, null_metrics
from tests.fakes import RecordingLimit

pytestmark = pytest.mark.anyio


def status_app(status: int, before: Callable[[RequestContext], None] | None = None) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        ctx = get_context(scope)
        if before is not None:
            before(ctx)
        ctx.record_status(status)  # the producer records the attempt's outcome
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


def build(inner: ASGIApp, limit: int = 4) -> tuple[ASGIApp, Limiter, RecordingLimit, Metrics]:
    metrics = null_metrics()
    algo = RecordingLimit(limit)
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


async def test_inner_exception_with_nothing_recorded_feeds_no_sample() -> None:
    """The gateway's own exception (no attempt recorded) is IGNORED and re-raised."""

    async def boom(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("gateway bug")

    app, limiter, algo, _ = build(boom)
    with pytest.raises(RuntimeError):
        await get(app)
    assert limiter.inflight == 0
    assert algo.samples == []


async def test_recorded_upstream_failure_then_exception_is_dropped() -> None:
    """An exception after a recorded upstream failure releases DROPPED."""

    async def reset(scope: Scope, receive: Receive, send: Send) -> None:
        get_context(scope).record(AttemptOutcome.PROTOCOL_ERROR)
        raise RuntimeError("reset")

    app, _, algo, _ = build(reset)
    with pytest.raises(RuntimeError):
        await get(app)
    assert [s.dropped for s in algo.samples] == [True]


@pytest.mark.parametrize(
    "mark",
    [
        lambda c: c.record(AttemptOutcome.CLIENT_GONE),
        lambda c: c.record(AttemptOutcome.GATEWAY_ERROR),
    ],
)
async def test_ignored_cases_feed_no_sample(mark: Callable[[RequestContext], None]) -> None:
    """Client gone or the gateway's own error leave no sample."""
    app, limiter, algo, _ = build(status_app(200, mark))
    await get(app)
    assert limiter.inflight == 0
    assert algo.samples == []


async def test_upstream_timeout_is_dropped_whatever_the_status() -> None:
    """A recorded TIMEOUT releases DROPPED."""
    app, _, algo, _ = build(status_app(504, lambda c: c.record(AttemptOutcome.TIMEOUT)))
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


def test_release_uses_the_recorded_outcome_and_head_rtt() -> None:
    """Nothing recorded is IGNORED; a recorded success samples the recorded RTT."""
    limiter = Limiter(RecordingLimit(4))
    algo = limiter.algorithm
    assert isinstance(algo, RecordingLimit)
    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    permit = limiter.try_acquire(0.0)
    assert permit is not None
    release(permit, ctx, 1.0)
    assert algo.samples == []
    permit = limiter.try_acquire(1.0)
    assert permit is not None
    ctx.record(AttemptOutcome.SUCCESS, rtt_s=0.05)
    release(permit, ctx, 9.0)
    assert [(s.rtt_s, s.dropped) for s in algo.samples] == [(0.05, False)]
