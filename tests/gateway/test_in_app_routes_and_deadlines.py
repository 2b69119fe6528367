"""In a FastAPI app with install(): per-route breakers, handler deadlines, remaining_ms, reload."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

import ballast_asgi
from ballast_asgi import get_context

pytestmark = pytest.mark.anyio


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/failing")
    async def failing() -> JSONResponse:
        return JSONResponse({"error": "down"}, status_code=503)

    @app.get("/healthy/{item}")
    async def healthy(item: str) -> dict[str, str]:
        return {"item": item}

    @app.get("/slow")
    async def slow() -> dict[str, str]:
        await asyncio.Event().wait()  # never finishes on its own
        return {"never": "reached"}

    @app.get("/budget")
    async def budget(request: Request) -> dict[str, float | None]:
        return {"remaining_ms": get_context(request.scope).remaining_ms()}

    return app


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://app")


async def test_a_failing_route_does_not_shed_a_healthy_route() -> None:
    """Twelve 503s open /failing's breaker; /healthy/{item} critical traffic is still served."""
    app = _app()
    handle = ballast_asgi.install(
        app,
        {"breaker": {"consecutive_failures": 5, "min_failing_clients": 1}},
        registry=CollectorRegistry(),
    )
    async with _client(app) as c:
        answers = [await c.get("/failing") for _ in range(12)]
        healthy = await c.get("/healthy/7", headers={"X-Priority": "critical"})
    assert [r.status_code for r in answers[:5]] == [503] * 5
    assert [r.headers.get("x-ballast-reason") for r in answers[:5]] == [None] * 5
    assert answers[-1].status_code == 503
    assert answers[-1].headers["x-ballast-reason"] == "breaker_open"
    assert healthy.status_code == 200 and healthy.json() == {"item": "7"}
    routes = handle.snapshot()["breaker"]["routes"]
    assert routes["/failing"]["state"] == "open"
    assert routes["/healthy/{item}"]["state"] == "closed"


async def test_global_scope_keeps_one_breaker() -> None:
    """breaker.scope: global restores one breaker for every route."""
    app = _app()
    ballast_asgi.install(
        app,
        {"breaker": {"consecutive_failures": 5, "scope": "global", "min_failing_clients": 1}},
        registry=CollectorRegistry(),
    )
    async with _client(app) as c:
        for _ in range(6):
            await c.get("/failing")
        r = await c.get("/healthy/1")
    assert r.status_code == 503 and r.headers["x-ballast-reason"] == "breaker_open"


async def test_a_deadline_cancels_the_running_handler_with_504() -> None:
    """/slow with X-Deadline-Ms: 30 is cancelled and answered 504, counted, permit released."""
    app = _app()
    handle = ballast_asgi.install(app, registry=CollectorRegistry())
    loop = asyncio.get_running_loop()
    async with _client(app) as c:
        started = loop.time()
        r = await c.get("/slow", headers={"X-Deadline-Ms": "30"})
        elapsed = loop.time() - started
    assert r.status_code == 504 and r.json()["error"] == "gateway_timeout"
    assert elapsed < 1.0
    metrics = handle.parts.metrics
    assert metrics.registry.get_sample_value("ballast_handler_deadline_cancelled_total") == 1
    assert handle.limiter.inflight == 0
    assert handle.snapshot()["breaker"]["routes"]["/slow"]["window_failures"] == 0


async def test_cancel_on_deadline_can_be_turned_off() -> None:
    """With cancel_on_deadline false the handler is not cancelled by the stack."""
    app = FastAPI()

    @app.get("/late")
    async def late() -> dict[str, bool]:
        await asyncio.sleep(0.05)
        return {"done": True}

    ballast_asgi.install(
        app, {"admission": {"cancel_on_deadline": False}}, registry=CollectorRegistry()
    )
    async with _client(app) as c:
        r = await c.get("/late", headers={"X-Deadline-Ms": "10"})
    assert r.status_code == 200


async def test_handlers_read_the_remaining_budget() -> None:
    """ctx.remaining_ms() gives the milliseconds left of X-Deadline-Ms (None without one)."""
    app = _app()
    ballast_asgi.install(app, registry=CollectorRegistry())
    async with _client(app) as c:
        with_budget = (await c.get("/budget", headers={"X-Deadline-Ms": "5000"})).json()
        without = (await c.get("/budget")).json()
    assert 0 < with_budget["remaining_ms"] <= 5000
    assert without["remaining_ms"] is None


async def test_the_handle_snapshots_and_reloads() -> None:
    """install() returns a handle: snapshot() shows the state, reload() applies a config."""
    app = _app()
    handle = ballast_asgi.install(app, registry=CollectorRegistry())
    assert isinstance(handle, ballast_asgi.Ballast)
    async with _client(app) as c:
        assert (await c.get("/healthy/1")).status_code == 200
        handle.reload({"shed": {"status": 503}, "admission": {"default_deadline_ms": 1}})
        r = await c.get("/healthy/1", headers={"X-Deadline-Ms": "0"})
    assert r.status_code == 503 and r.headers["x-ballast-reason"] == "deadline"
    assert handle.snapshot()["config"]["version"] == 2


async def test_the_middleware_package_composes_a_stack_on_its_own() -> None:
    """Every stage and collaborator comes from ballast_asgi.middleware alone."""
    from ballast_asgi import middleware as m

    metrics = m.null_metrics()
    responder = m.ShedResponder(metrics)
    limiter = m.Limiter(m.make_limit("fixed", limit=2))
    inner = m.BreakerMiddleware(_app(), breaker=m.Breaker(), responder=responder, metrics=metrics)
    inner = m.ConcurrencyMiddleware(inner, limiter=limiter, responder=responder, metrics=metrics)
    app = m.AdmissionMiddleware(inner, responder=responder, metrics=metrics)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://a") as c:
        assert (await c.get("/healthy/3")).json() == {"item": "3"}
    assert limiter.inflight == 0
    assert set(m.__all__) >= {"RetryMiddleware", "BodyMiddleware", "HandlerMiddleware"}
